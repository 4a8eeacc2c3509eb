"""Tool-call integrity: DeepSeek DSML markup that reached assistant content instead of `tool_calls`.

Pure and standard library only (it runs inside SGLang's image): `markup` knows the markers, `salvage` parses a
leaked block strictly, `stream` finds blocks in text arriving in chunks, `sse` applies that to OpenAI stream
chunks, `report` counts and logs. `pdfleet.runtime.patches.impl.dsml_leak_guard` hooks it into SGLang.
"""
