{{/* The release-scoped name of a component: <release>-<component>, cut to 63 characters. */}}
{{- define "lmforge.name" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "lmforge.labels" -}}
app.kubernetes.io/name: lmforge
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Labels a selector matches a component's pods by. */}}
{{- define "lmforge.selectorLabels" -}}
app.kubernetes.io/name: lmforge
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of monitoring objects: the common ones plus monitoring.additionalLabels
     (e.g. release: kube-prometheus-stack, which that stack's Prometheus selects on). */}}
{{- define "lmforge.monitoringLabels" -}}
{{ include "lmforge.labels" . }}
{{- with .root.Values.monitoring.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
