{{- define "agentfleet.name" -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}

{{- define "agentfleet.labels" -}}
app.kubernetes.io/name: agentfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "agentfleet.selector" -}}
app.kubernetes.io/name: agentfleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentfleet.secret" -}}
{{ required "existingSecret is required: the name of a Secret holding dispatcher.creds and worker.creds (dispatcher auth init)" .Values.existingSecret }}
{{- end -}}

{{- define "agentfleet.natsURL" -}}
{{- if .Values.nats.enabled -}}
nats://{{ .Release.Name }}-nats:4222
{{- else -}}
{{ required "externalNats.url is required when nats.enabled is false" .Values.externalNats.url }}
{{- end -}}
{{- end -}}

{{- define "agentfleet.image" -}}
{{- $img := index .root.Values.image .which -}}
{{- with .root.Values.image.registry }}{{ . }}/{{ end }}{{ $img.repository }}:{{ $img.tag }}
{{- end -}}
