{{/* Full name: the release name if it contains the chart name, else release-chart. */}}
{{- define "remediate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "remediate.serviceAccountName" -}}
{{- default (include "remediate.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels on every object (the kustomize base sets name and part-of). */}}
{{- define "remediate.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/part-of: remediate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "remediate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "remediate.mode" -}}
{{- if .Values.enforce }}enforce{{ else }}audit{{ end -}}
{{- end -}}

{{/* Name of the ConfigMap the DaemonSet mounts. */}}
{{- define "remediate.policyConfigMap" -}}
{{- if .Values.policy.existingConfigMap -}}
{{- .Values.policy.existingConfigMap -}}
{{- else -}}
{{- printf "%s-policy-%s" (include "remediate.fullname" .) (include "remediate.mode" .) -}}
{{- end -}}
{{- end -}}

{{/* Image reference: repository:tag[@digest], tag defaulting to appVersion, never latest. */}}
{{- define "remediate.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag: \"latest\" is refused; pin a version (and optionally image.digest)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
Pod Security Admission: remediate's pod needs hostNetwork, hostPID and
hostPath, which only the "privileged" level allows. Installing into a
namespace that enforces baseline or restricted would create a DaemonSet
whose pods are all refused; fail instead, with the reason. The namespace is
looked up on the cluster (helm install/upgrade, helm template
--dry-run=server); plain helm template has no cluster and checks nothing.
*/}}
{{- define "remediate.podSecurityCheck" -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- if $ns -}}
{{- $labels := default dict $ns.metadata.labels -}}
{{- $level := default "" (index $labels "pod-security.kubernetes.io/enforce") -}}
{{- if and $level (ne $level "privileged") -}}
{{- fail (printf "namespace %s enforces Pod Security level %q (label pod-security.kubernetes.io/enforce): remediate's pod needs hostNetwork, hostPID and hostPath, which only \"privileged\" allows, so its DaemonSet would be accepted and every pod refused. Install into a namespace of its own labelled privileged (kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged; see the README, Pod Security)" .Release.Namespace $level .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
