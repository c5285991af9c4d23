{{/*
Alert rules and dashboard from files/, scoped to this release: `__SELECTOR__` in
files/alerts.yaml and files/dashboard.json becomes the release's label matchers
(namespace and job = the metrics Service), `__RELEASE__` the release name, `__UID__` the
dashboard uid; every alert also gets the labels namespace, release and alerts.alertLabels.
*/}}
{{- define "nodewarden.alertRules" -}}
{{- $text := .Files.Get "files/alerts.yaml" | replace "__SELECTOR__" (include "nodewarden.promSelector" .) | replace "__RELEASE__" .Release.Name -}}
{{- $rules := fromYaml $text -}}
{{- $extra := merge (dict "namespace" .Release.Namespace "release" .Release.Name) .Values.alerts.alertLabels -}}
{{- range $group := $rules.groups -}}
{{- $_ := set $group "name" (printf "%s-%s" $group.name $.Release.Name) -}}
{{- range $rule := $group.rules -}}
{{- $_ := set $rule "labels" (merge (dict) (default (dict) $rule.labels) $extra) -}}
{{- end -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}

{{- define "nodewarden.dashboard" -}}
{{- $selector := include "nodewarden.promSelector" . | toJson | trimPrefix "\"" | trimSuffix "\"" -}}
{{- .Files.Get "files/dashboard.json" | replace "__SELECTOR__" $selector | replace "__UID__" (include "nodewarden.dashboardUid" .) | replace "__RELEASE__" (printf "%s/%s" .Release.Namespace .Release.Name) -}}
{{- end -}}
