"""SGLang patches applied by the engine launcher, and the catalogue that describes them.

Everything here runs inside SGLang's own image, so it uses the standard library only.
"""
