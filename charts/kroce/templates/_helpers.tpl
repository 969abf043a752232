{{/* Common names and labels. */}}
{{- define "kroce.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kroce.labels" -}}
app.kubernetes.io/name: kroce
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kroce.selector" -}}
app.kubernetes.io/name: kroce
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* image "kroce.image" (dict "root" $ "img" .Values.image.node) */}}
{{- define "kroce.image" -}}
{{- $tag := default .root.Chart.AppVersion .img.tag -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) .img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .img.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "kroce.testNamespace" -}}
{{- default .Release.Namespace .Values.operator.testNamespace -}}
{{- end -}}
