"""The parts the chart's two generated ValidatingAdmissionPolicies share: the policy's head (its name and the pool
writes it matches) and its binding to the namespaces the release watches. Strings of a helm template."""

from __future__ import annotations

from pdfleet.operator.api import meta

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
NAME = '{{ include "pdfleet.clusterScopedName" . }}'


def _head(kind: str, suffix: str) -> str:
    return f"""apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata:
  name: {NAME}-{suffix}
  labels:
    {{{{- include "pdfleet.labels" . | nindent 4 }}}}
spec:"""


def policy_head(suffix: str) -> str:
    """From `apiVersion` to `spec:` of the policy named `<release name>-<suffix>`."""
    return _head("ValidatingAdmissionPolicy", suffix)


def match_constraints() -> str:
    group, version = meta.API_VERSION.split("/")
    return f"""  matchConstraints:
    resourceRules:
      - apiGroups: [{group}]
        apiVersions: [{version}]
        operations: [CREATE, UPDATE]
        resources: [{meta.PLURAL}]"""


def binding(suffix: str, action: str) -> str:
    """The policy's binding (`validationActions: [action]`), to the release's namespaces when it names them."""
    return f"""{_head("ValidatingAdmissionPolicyBinding", suffix)}
  policyName: {NAME}-{suffix}
  validationActions: [{action}]
  {{{{- with .Values.watchNamespaces }}}}
  matchResources:
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: {{{{ toJson . }}}}
  {{{{- end }}}}"""
