{{- define "nodewarden.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "nodewarden.labels" -}}
app.kubernetes.io/name: nodewarden
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "nodewarden.selectorLabels" -}}
app.kubernetes.io/name: nodewarden
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nodewarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "nodewarden.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "nodewarden.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace -}}
{{- end -}}
