{{/* The chart's name (nameOverride, default the chart name): the app.kubernetes.io/name label. */}}
{{- define "lmforge.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: fullnameOverride; else, with nameOverride set, the
     conventional <release>-<name> (just <release> when it already contains the name); else
     <release> alone. Unlike the usual helper, no override keeps plain <release>: every object
     name ends in its component (<release>-inference), so the chart name would only repeat, and
     the names stay the ones earlier versions of the chart created. */}}
{{- define "lmforge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if and .Values.nameOverride (not (contains .Values.nameOverride .Release.Name)) -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of a component's objects: <fullname>-<component>, at most 63 characters; a long
     fullname is cut, never the component, so that components keep distinct names.
     Arguments: dict "root" $ "component" "inference" */}}
{{- define "lmforge.componentName" -}}
{{- $prefix := include "lmforge.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-" -}}
{{- printf "%s-%s" $prefix .component -}}
{{- end -}}

{{/* The name of one run's objects: <fullname>-<component>-<run> as a DNS label (the run lower
     case, other characters turned into "-"), at most .max characters (default 63). A longer one
     is cut and ends in 6 hex digits of the whole name's hash, so two runs never share a name.
     Arguments: dict "root" $ "component" "dataprep" "run" RUN "max" 41 */}}
{{- define "lmforge.runName" -}}
{{- $max := int (.max | default 63) -}}
{{- $name := printf "%s-%s-%s" (include "lmforge.fullname" .root) .component (include "lmforge.dnsLabel" .run) -}}
{{- if le (len $name) $max -}}
{{- $name -}}
{{- else -}}
{{- printf "%s-%s" (regexReplaceAll "-+$" ($name | trunc (int (sub $max 7))) "") (sha256sum $name | trunc 6) -}}
{{- end -}}
{{- end -}}

{{/* A string as a DNS label's characters: lower case, runs of anything but [a-z0-9] as one "-",
     no "-" at either end (not cut to a length). */}}
{{- define "lmforge.dnsLabel" -}}
{{- regexReplaceAll "[^a-z0-9]+" (lower (toString .)) "-" | trimAll "-" -}}
{{- end -}}

{{/* The name of a bundled dependency chart's objects (its own fullname helper's rule), for the
     Services this chart points at: the section's fullnameOverride, else <release>-<name>, or
     just <release> when it contains <name> (name = the section's nameOverride or the chart).
     Arguments: dict "root" $ "chart" "prometheus-pushgateway" */}}
{{- define "lmforge.dependencyFullname" -}}
{{- $values := index .root.Values .chart | default dict -}}
{{- $name := $values.nameOverride | default .chart -}}
{{- if $values.fullnameOverride -}}
{{- $values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The data-prep run: dataprep.run, else the last segment of dataprep.output (the dataset's
     name), as a DNS label of at most 40 characters; it is the lmforge.io/run label's value. */}}
{{- define "lmforge.dataprepRun" -}}
{{- $d := .Values.dataprep -}}
{{- $run := $d.run | default (base (trimSuffix "/" $d.output)) -}}
{{- include "lmforge.dnsLabel" $run | trunc 40 | trimSuffix "-" | required "dataprep.run: no run name (set dataprep.run)" -}}
{{- end -}}

{{/* A data-prep Job's name: <fullname>-dataprep-<run>-<role> (role: workers or a global stage
     of lmforge.dataprep.stages, <stage>-NN for a round), named per run so that an upgrade
     starting another run creates new Jobs instead of changing the (immutable) template of the
     last run's. The run part is at most 41 characters: with "-", the longest role
     ("components-NN", 13) and an Indexed pod's "-<index>" (the pods take the host name
     <job>-<index>, a DNS label) it fits in 63.
     Arguments: dict "root" $ "role" "workers" */}}
{{- define "lmforge.dataprepJobName" -}}
{{- $run := include "lmforge.runName" (dict "root" .root "component" "dataprep" "run" (include "lmforge.dataprepRun" .root) "max" 41) -}}
{{- printf "%s-%s" $run .role -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "lmforge.labels" -}}
app.kubernetes.io/name: {{ include "lmforge.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Labels a selector matches a component's pods by. */}}
{{- define "lmforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lmforge.name" .root }}
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
{{- .Values.serviceAccount.name | default (include "lmforge.componentName" (dict "root" . "component" "workloads")) -}}
{{- end -}}

{{/* The pipeline runner's ServiceAccount name. */}}
{{- define "lmforge.pipelineRunnerName" -}}
{{- .Values.pipelineRunner.name | default (include "lmforge.componentName" (dict "root" . "component" "pipeline-runner")) -}}
{{- end -}}

{{/* topologySpreadConstraints of component .component from .section.topologySpread: the given
     `constraints` as they are, else one per topologyKeys entry (maxSkew, whenUnsatisfiable),
     counting the component's pods of the same Deployment revision (pod-template-hash), so a
     rolling update spreads the new pods too. Nothing when disabled. */}}
{{- define "lmforge.topologySpread" -}}
{{- $spread := .section.topologySpread -}}
{{- if $spread.enabled -}}
{{- if $spread.constraints -}}
{{ toYaml $spread.constraints }}
{{- else -}}
{{- range $spread.topologyKeys }}
- topologyKey: {{ . }}
  maxSkew: {{ int $spread.maxSkew }}
  whenUnsatisfiable: {{ $spread.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- include "lmforge.selectorLabels" (dict "root" $.root "component" $.component) | nindent 6 }}
  matchLabelKeys: [pod-template-hash]
{{- end }}
{{- end -}}
{{- end -}}
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
{{- printf "http://%s:9091" (include "lmforge.dependencyFullname" (dict "root" . "chart" "prometheus-pushgateway")) -}}
{{- end -}}
{{- end -}}

{{/* The OTLP/HTTP endpoint for traces, or "" for none. */}}
{{- define "lmforge.otlpEndpoint" -}}
{{- if .Values.telemetry.otlpEndpoint -}}
{{- .Values.telemetry.otlpEndpoint -}}
{{- else if (index .Values "opentelemetry-collector").enabled -}}
{{- printf "http://%s:4318" (include "lmforge.dependencyFullname" (dict "root" . "chart" "opentelemetry-collector")) -}}
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
