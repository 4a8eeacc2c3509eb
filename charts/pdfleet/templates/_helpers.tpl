{{/* The chart name, overridable by nameOverride. */}}
{{- define "pdfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, or the release name when it already contains the
chart name, or "<release>-<chart>". Truncated to 63 characters (DNS label).
*/}}
{{- define "pdfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of cluster-scoped objects (ClusterRole, ClusterRoleBinding): the full name plus the release namespace, so
that two releases of the same name in different namespaces (namespaced mode) do not collide.
*/}}
{{- define "pdfleet.clusterScopedName" -}}
{{- printf "%s-%s" (include "pdfleet.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "pdfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "pdfleet.labels" -}}
helm.sh/chart: {{ include "pdfleet.chart" . }}
{{ include "pdfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdfleet
{{- end }}

{{/* Labels that select the operator pod (immutable in the Deployment: never add to them). */}}
{{- define "pdfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "pdfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false (the RBAC binds to it)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag, digest} and the chart (as "image" and "chart" of a dict): with a
digest, repository[:tag]@digest (the tag only when given; the digest decides what runs); without one,
repository:tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "pdfleet.imageRef" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- if $image.tag }}
{{- printf "%s:%s@%s" $image.repository $image.tag $image.digest }}
{{- else }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- end }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The operator image reference. */}}
{{- define "pdfleet.image" -}}
{{- include "pdfleet.imageRef" (dict "image" .Values.image "chart" .Chart) }}
{{- end }}

{{/* The runtime image reference: what the operator passes to engine pods' init container (--runtime-image). */}}
{{- define "pdfleet.runtimeImage" -}}
{{- include "pdfleet.imageRef" (dict "image" .Values.runtime.image "chart" .Chart) }}
{{- end }}

{{/* True (non-empty) in cluster-wide mode: no watchNamespaces given. */}}
{{- define "pdfleet.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/* Checks across values that the schema cannot express. */}}
{{- define "pdfleet.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicaCount is %d, but without leader election only one replica may be active (every replica would write). Set replicaCount to 1 (or 0), or enable leaderElection." (int .Values.replicaCount)) }}
{{- end }}
{{- if eq (int .Values.healthPort) (int .Values.metrics.port) }}
{{- fail (printf "healthPort and metrics.port are both %d: the health and metrics endpoints need their own ports" (int .Values.healthPort)) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes the metrics Service" }}
{{- end }}
{{- end }}

{{/*
RBAC rules for the namespaced resources the operator reads and writes. Cluster-wide they go into the
ClusterRole; in namespaced mode into a Role in each watched namespace. tests/unit/test_chart.py holds the
same table: widening a rule here fails it on purpose.
*/}}
{{- define "pdfleet.namespacedRules" -}}
# The pools: kopf patches finalizers and its annotations; it never updates or deletes them.
- apiGroups: [pdfleet.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch]
- apiGroups: [pdfleet.dev]
  resources: [inferencepools/status]
  verbs: [get, patch, update]
# Owned objects set blockOwnerDeletion; clusters with the OwnerReferencesPermissionEnforcement admission plugin
# (OpenShift, for one) require update on the owner's finalizers for that.
- apiGroups: [pdfleet.dev]
  resources: [inferencepools/finalizers]
  verbs: [update]
# InferencePoolRoles: a role of a pool as a scale target (spec.<role>.scaleTarget). The operator creates and
# deletes them, writes their replicas when the pool's change, and their status; scalers write their /scale.
- apiGroups: [pdfleet.dev]
  resources: [inferencepoolroles]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [pdfleet.dev]
  resources: [inferencepoolroles/status]
  verbs: [patch]
# Engine pods: the operator owns their lifecycle. No pods/exec: evidence comes from the rank-health agent.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
# Each pool's router-key Secret, read and written by name only: no list or watch, so the operator never reads a
# Secret it was not told the name of (RBAC cannot narrow by name a Secret created later).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
# The router's ServiceAccount (for its Kubernetes service discovery).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
# The router.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# Each pool's NetworkPolicies.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
# The routers' PodDisruptionBudget.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# The router's Role (pods get/list/watch, for pod discovery) and its RoleBinding. RBAC forbids granting what
# one does not hold, so the operator keeps pods get/list/watch above; it gets neither `escalate` nor `bind`.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, delete]
# Kueue's Workloads (spec.<role>.scheduling.gang), read by name only while Kueue holds a group, for the reason
# it waits (QuotaReserved=False). Never written, listed or watched; harmless where Kueue is not installed.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get]
{{- end }}

{{/* kopf reads CustomResourceDefinitions to discover the InferencePool resource. */}}
{{- define "pdfleet.crdDiscoveryRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end }}
