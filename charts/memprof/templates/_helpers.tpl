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

{{/* The Secret with the key of the admission marks (--admission-key-secret). */}}
{{- define "memprof.admissionKeySecret" -}}
{{- printf "%s-admission-key" (include "memprof.fullname" .) | trunc 63 | trimSuffix "-" }}
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

{{/*
Values the chart refuses, each with a message that says what to do. Included
by the Deployment, so `helm install`, `helm upgrade` and `helm template` stop
here. The schema accepts these keys so that the message is this one rather
than "Additional property ... is not allowed".
*/}}
{{- define "memprof.validate" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set. No registry publishes the memprof image: build it (make image), push it to a registry your nodes pull from, and install with --set image.repository=REGISTRY/memprof/memprof --set image.tag=TAG (docs/install.md, \"Install\")." }}
{{- end }}
{{- if hasKey .Values "serviceMonitor" }}
{{- if not (eq .Values.serviceMonitor nil) }}
{{- fail "serviceMonitor moved to monitoring.serviceMonitor: set monitoring.serviceMonitor.enabled (and .interval, .labels) instead. With --reuse-values from an older release, also pass --set serviceMonitor=null." }}
{{- end }}
{{- end }}
{{- if hasKey .Values.monitoring.prometheusRule "for" }}
{{- if not (eq (get .Values.monitoring.prometheusRule "for") nil) }}
{{- fail "monitoring.prometheusRule.for was removed: the alerts now confirm a condition on two consecutive scrapes instead of waiting (docs/observability.md, \"What the alerts guarantee\"). Remove it (with --reuse-values: --set monitoring.prometheusRule.for=null)." }}
{{- end }}
{{- end }}
{{- end }}

{{/* A duration value (the schema's pattern: 15s, 1.5m, 500ms, 1h) in seconds, as a float. */}}
{{- define "memprof.seconds" -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 }}
{{- $unit := regexFind "(ms|s|m|h)$" . }}
{{- $scale := get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit }}
{{- mulf $n $scale }}
{{- end }}

{{/* A number of seconds as a PromQL duration: whole seconds when exact, else milliseconds. */}}
{{- define "memprof.promDuration" -}}
{{- $ms := round (mulf (float64 .) 1000.0) 0 | int }}
{{- if eq (mod $ms 1000) 0 }}{{ div $ms 1000 }}s{{ else }}{{ $ms }}ms{{ end }}
{{- end }}

{{/*
The window over which the alerts on the operator's memprof_job_* gauges
confirm a condition: two scrapes of monitoring.serviceMonitor.interval.
*/}}
{{- define "memprof.operatorWindow" -}}
{{- include "memprof.promDuration" (mulf 2.0 (include "memprof.seconds" .Values.monitoring.serviceMonitor.interval | float64)) }}
{{- end }}

{{/*
Worst-case lead of MemprofOOMRiskCritical before a predicted OOM that comes
on time, in seconds (docs/observability.md, "What the alerts guarantee"):
criticalTtoSeconds, less the sidecar's analysis and the operator's status
write (2 s), two operator scrapes and one rule evaluation.
*/}}
{{- define "memprof.criticalLeadSeconds" -}}
{{- $scrape := include "memprof.seconds" .Values.monitoring.serviceMonitor.interval | float64 }}
{{- $eval := include "memprof.seconds" .Values.monitoring.prometheusRule.interval | float64 }}
{{- $critical := dig "criticalTtoSeconds" 120.0 .Values.thresholds | float64 }}
{{- subf $critical 2.0 (mulf 2.0 $scrape) $eval }}
{{- end }}

{{/*
80 % of the samples of an operator series that 10 minutes of scrapes every
monitoring.serviceMonitor.interval store (MemprofOperatorScrapedTooRarely).
*/}}
{{- define "memprof.expectedSamples" -}}
{{- $scrape := include "memprof.seconds" .Values.monitoring.serviceMonitor.interval | float64 }}
{{- printf "%.0f" (floor (mulf 0.8 (divf 600.0 $scrape))) }}
{{- end }}
