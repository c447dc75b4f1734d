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

{{/* The image of service .service ("dataprep", "trainer", …): [registry/]repository:tag. */}}
{{- define "lmforge.image" -}}
{{- $values := .root.Values -}}
{{- $repository := index $values.images .service -}}
{{- $tag := $values.image.tag | default .root.Chart.AppVersion -}}
{{- with $values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .) $repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The workloads' ServiceAccount name. */}}
{{- define "lmforge.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "lmforge.name" (dict "root" . "component" "workloads")) -}}
{{- end -}}

{{/* The pipeline runner's ServiceAccount name. */}}
{{- define "lmforge.pipelineRunnerName" -}}
{{- .Values.pipelineRunner.name | default (include "lmforge.name" (dict "root" . "component" "pipeline-runner")) -}}
{{- end -}}

{{/* Pod-level security context of every pod: runAsNonRoot always, the rest from values. */}}
{{- define "lmforge.podSecurityContext" -}}
runAsNonRoot: true
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{/* Container-level security context of every container (init containers and sidecars too). */}}
{{- define "lmforge.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The pod spec fields every lmforge pod shares: identity, security, image pull secrets, and
     the scheduling fields of component section .section (nodeSelector, tolerations, affinity,
     priorityClassName). */}}
{{- define "lmforge.podCommon" -}}
{{- $values := .root.Values -}}
serviceAccountName: {{ include "lmforge.serviceAccountName" .root }}
automountServiceAccountToken: false
securityContext:
  {{- include "lmforge.podSecurityContext" .root | nindent 2 }}
{{- with $values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with .section.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .section.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .section.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .section.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Environment of every lmforge container: the log level, and the object store (endpoint,
     region, and the access keys only by reference to a user-provided Secret). */}}
{{- define "lmforge.env" -}}
- name: LMFORGE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- with .Values.s3.endpointUrl }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.region }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.s3.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{/* Config overrides from a nested map, as YAML list items: "a.b=<JSON value>" per leaf, each
     preceded by .flag when given (e.g. "--set"). The services parse each value as YAML (JSON is
     YAML), so strings, numbers, booleans, lists and maps keep their types.
     Arguments: dict "values" MAP "prefix" "" "flag" "--set"|"" */}}
{{- define "lmforge.overrides" -}}
{{- $prefix := .prefix | default "" -}}
{{- $flag := .flag | default "" -}}
{{- range $key, $value := .values }}
{{- $path := ternary $key (printf "%s.%s" $prefix $key) (eq $prefix "") }}
{{- if and (kindIs "map" $value) (gt (len $value) 0) }}
{{- include "lmforge.overrides" (dict "values" $value "prefix" $path "flag" $flag) }}
{{- else }}
{{- if $flag }}
- {{ $flag }}
{{- end }}
- {{ printf "%s=%s" $path (include "lmforge.yamlValue" $value) | toJson }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A value as the services' overrides parse it (YAML): a plain word or path stays as it is
     (model.preset=tiny), anything else is written as JSON (a quoted string, a number, a list). */}}
{{- define "lmforge.yamlValue" -}}
{{- if and (kindIs "string" .) (regexMatch "^[A-Za-z_/][A-Za-z0-9_./:-]*$" .) (not (has (lower .) (list "true" "false" "yes" "no" "on" "off" "null"))) -}}
{{- . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/* Fails when the user's config map .values sets one of the keys the chart owns (.owned: a list
     of dotted paths), naming the value to set instead (.hint: path → hint). */}}
{{- define "lmforge.checkOwned" -}}
{{- $values := .values -}}
{{- range $path, $hint := .owned }}
{{- $node := $values }}
{{- $found := true }}
{{- range $part := splitList "." $path }}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) }}
{{- $node = index $node $part }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}
{{- fail (printf "%s.%s is set by the chart: %s" $.section $path $hint) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Pushgateway URL the batch jobs push to, or "" for none. */}}
{{- define "lmforge.pushgateway" -}}
{{- if .Values.telemetry.pushgateway -}}
{{- .Values.telemetry.pushgateway -}}
{{- else if (index .Values "prometheus-pushgateway").enabled -}}
{{- printf "http://%s-prometheus-pushgateway:9091" .Release.Name -}}
{{- end -}}
{{- end -}}

{{/* The OTLP/HTTP endpoint for traces, or "" for none. */}}
{{- define "lmforge.otlpEndpoint" -}}
{{- if .Values.telemetry.otlpEndpoint -}}
{{- .Values.telemetry.otlpEndpoint -}}
{{- else if (index .Values "opentelemetry-collector").enabled -}}
{{- printf "http://%s-opentelemetry-collector:4318" .Release.Name -}}
{{- end -}}
{{- end -}}

{{/* The canary's API key Secret (name and key), or an empty name for none. */}}
{{- define "lmforge.canaryKeySecret" -}}
{{- if .Values.canary.apiKey.secretName -}}
{{- dict "name" .Values.canary.apiKey.secretName "key" .Values.canary.apiKey.key | toJson -}}
{{- else if .Values.inference.apiKeys.secretName -}}
{{- dict "name" .Values.inference.apiKeys.secretName "key" .Values.inference.apiKeys.key | toJson -}}
{{- else -}}
{{- dict "name" "" "key" "" | toJson -}}
{{- end -}}
{{- end -}}
