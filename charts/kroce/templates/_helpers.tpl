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

{{/* Where perftest pods run. Never the release namespace: that one admits
the privileged node daemon, and the controller may create pods here. */}}
{{- define "kroce.testNamespace" -}}
{{- if eq .Values.operator.testNamespace .Release.Namespace -}}
{{- fail (printf "operator.testNamespace %q is the release namespace: perftest pods need their own namespace (the controller may create pods there, and the release namespace admits the privileged node daemon)" .Values.operator.testNamespace) -}}
{{- end -}}
{{- .Values.operator.testNamespace -}}
{{- end -}}

{{/* CEL: COND (on container `c`) holds for every container list of a pod.
Containers, init and ephemeral containers have different CEL types, so they
are checked list by list, never concatenated. */}}
{{- define "kroce.allContainers" -}}
object.spec.containers.all(c, {{ . }}) &&
(!has(object.spec.initContainers) || object.spec.initContainers.all(c, {{ . }})) &&
(!has(object.spec.ephemeralContainers) || object.spec.ephemeralContainers.all(c, {{ . }}))
{{- end }}

{{/* The device plugin ConfigMap the controller writes (--configmap). */}}
{{- define "kroce.configmapName" -}}
kroce-device-plugin
{{- end }}

{{/* The controller's leader Lease (--lease-name). */}}
{{- define "kroce.leaseName" -}}
kroce-operator
{{- end }}
