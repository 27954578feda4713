{{/* Name of the chart, overridable. */}}
{{- define "memprof.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; also the MutatingWebhookConfiguration's name. */}}
{{- define "memprof.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "memprof.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "memprof.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "memprof.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memprof.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "memprof.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "memprof.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memprof
{{- end }}

{{- define "memprof.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memprof.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "memprof.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The sidecar runs from the operator's image unless told otherwise. */}}
{{- define "memprof.sidecarImage" -}}
{{- printf "%s:%s" (.Values.sidecar.image.repository | default .Values.image.repository) (.Values.sidecar.image.tag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "memprof.webhookService" -}}
{{- printf "%s-webhook" (include "memprof.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "memprof.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "memprof.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The webhook's namespaceSelector: the values', narrowed to rbac.namespaces in a
namespaced install (by the kubernetes.io/metadata.name label, set on every
namespace since Kubernetes 1.21).
*/}}
{{- define "memprof.webhookNamespaceSelector" -}}
{{- $sel := deepCopy .Values.webhook.namespaceSelector -}}
{{- if .Values.rbac.namespaces -}}
{{- $exprs := get $sel "matchExpressions" | default list -}}
{{- $exprs = append $exprs (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .Values.rbac.namespaces) -}}
{{- $_ := set $sel "matchExpressions" $exprs -}}
{{- end -}}
{{- toYaml $sel -}}
{{- end }}
