{{/* Chart name, or nameOverride. */}}
{{- define "nodewarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix: fullnameOverride, or <release>-<name> (the release alone if it contains the name). */}}
{{- define "nodewarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "nodewarden.name" . -}}
{{- if contains $name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nodewarden.labels" -}}
app.kubernetes.io/name: {{ include "nodewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodewarden
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "nodewarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nodewarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "nodewarden.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "nodewarden.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace -}}
{{- end -}}

{{/* The image reference; fails with the fix when no repository is configured. */}}
{{- define "nodewarden.image" -}}
{{- $repo := required "image.repository is not set: nodewarden publishes no public image. Build it with `make image`, push it to your registry and set image.repository (see the chart README, \"Image\")" .Values.image.repository -}}
{{- $ref := printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}{{ printf "%s@%s" $ref .Values.image.digest }}{{- else -}}{{ $ref }}{{- end -}}
{{- end -}}

{{/* Name of the metrics Service = the `job` label Prometheus gives its targets. */}}
{{- define "nodewarden.metricsService" -}}
{{- printf "%s-metrics" (include "nodewarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* PromQL label matchers selecting this release's metrics (namespace + job). */}}
{{- define "nodewarden.promSelector" -}}
namespace="{{ .Release.Namespace }}", job="{{ include "nodewarden.metricsService" . }}"
{{- end -}}

{{/* Grafana dashboard uid: unique per release and namespace, at most 40 characters. */}}
{{- define "nodewarden.dashboardUid" -}}
{{- printf "nodewarden-%s" (printf "%s/%s" .Release.Namespace .Release.Name | sha256sum | trunc 12) -}}
{{- end -}}

{{/* The user name the API server knows the operator by (docs/security.md, requesters). */}}
{{- define "nodewarden.operatorUsername" -}}
{{- default (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodewarden.serviceAccountName" .)) .Values.requesters.operatorUsername -}}
{{- end -}}

{{/* Name of the requester admission policy and its binding (cluster-scoped: one per release). */}}
{{- define "nodewarden.requesterPolicy" -}}
{{- printf "%s-%s-powerintents" (include "nodewarden.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
