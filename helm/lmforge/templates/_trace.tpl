{{- /*
/v1/trace in the inference pod (inference.trace; docs/inference.md "Tracing outputs to training
documents"). The index (a data-prep output's trace-index/) is downloaded from the object store
with the pod's own S3 settings (lmforge.env, as the model) into the `trace-cache` emptyDir, then
served from there (lmforge.trace.cache.fetch_index: checked against index.json's sha256s,
reused while complete).

- backend lmforge: lmforge-serve gets the server config's trace.* fields (lmforge.traceSettings)
  and the cache volume, and serves /v1/trace itself, on its API port;
- backend vllm: vLLM has no such route, so a `trace` container (lmforge.traceContainer: the
  lmforge inference image's standalone trace service, lmforge.inference.trace_service) serves it
  beside vLLM on inference.trace.tracePort, with the same API keys file, reached through the
  Service's `trace` port (the NetworkPolicy admits the same peers there as on the API port, and
  Prometheus: its /metrics is there too, a second endpoint of the inference ServiceMonitor).
*/ -}}

{{/* Where the trace-cache emptyDir is mounted: the server's trace.cache_dir. */}}
{{- define "lmforge.traceCacheDir" -}}
/var/cache/lmforge/trace
{{- end -}}

{{/* True ("true") when the inference pod serves /v1/trace. Fails when it is on without an index. */}}
{{- define "lmforge.traceEnabled" -}}
{{- $t := .Values.inference.trace | default dict -}}
{{- if $t.enabled -}}
{{- if not $t.index -}}
{{- fail "inference.trace.enabled needs inference.trace.index: the trace-index/ folder of a data-prep output (dataprep.config.trace_index.enabled), e.g. s3://lmforge/datasets/cc-main-2024-22/trace-index" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The server config's trace.* fields, as --set list items (both backends' trace servers). */}}
{{- define "lmforge.traceSettings" -}}
{{- $t := .Values.inference.trace -}}
- --set
- {{ printf "trace.index=%s" (include "lmforge.yamlValue" $t.index) | toJson }}
- --set
- trace.cache_dir={{ include "lmforge.traceCacheDir" . }}
- --set
- trace.max_concurrent={{ int $t.maxConcurrent }}
- --set
- trace.timeout_s={{ $t.timeoutSeconds }}
- --set
- trace.max_tokens={{ int $t.maxTokens }}
{{- end -}}

{{/* The trace-cache volume mount (a container's volumeMounts item). */}}
{{- define "lmforge.traceCacheMount" -}}
- name: trace-cache
  mountPath: {{ include "lmforge.traceCacheDir" . }}
{{- end -}}

{{/* The trace-cache volume (a pod's volumes item). */}}
{{- define "lmforge.traceCacheVolume" -}}
# The trace index, downloaded from inference.trace.index (inference.trace.cacheSize).
- name: trace-cache
  emptyDir:
    sizeLimit: {{ .Values.inference.trace.cacheSize }}
{{- end -}}

{{/* With backend vllm: the `trace` container serving /v1/trace beside vLLM (a containers item). */}}
{{- define "lmforge.traceContainer" -}}
{{- $i := .Values.inference -}}
{{- $t := $i.trace -}}
{{- $servedName := $i.modelName | default (base (trimSuffix "/" $i.model)) -}}
- name: trace
  image: {{ include "lmforge.image" (dict "root" . "service" "inference") }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [python, -m, lmforge.inference.trace_service]
  args:
    - --host
    - 0.0.0.0
    - --port
    - {{ $t.tracePort | toString | quote }}
    {{- include "lmforge.traceSettings" . | nindent 4 }}
    # The model_name label of its metrics and the answers' `model`: vLLM's --served-model-name.
    - --set
    - {{ printf "model_name=%s" (include "lmforge.yamlValue" $servedName) | toJson }}
    - --set
    - api_docs={{ $i.apiDocs | default false }}
    {{- if $i.apiKeys.secretName }}
    # The keys file vLLM takes its key from: every key in it is accepted here.
    - --set
    - api_keys_file=/var/run/secrets/lmforge/api-keys/keys
    {{- end }}
  ports:
    - name: trace
      containerPort: {{ int $t.tracePort }}
      protocol: TCP
  env:
    {{- include "lmforge.env" . | nindent 4 }}
  # /healthz answers while the service serves HTTP, also while the index downloads (/v1/trace
  # answers 503 meanwhile): a slow download never holds vLLM's completions back. /metrics (the
  # lmforge_inference_trace_* series) is on the same port, scraped through the Service's `trace`
  # port by the inference ServiceMonitor.
  readinessProbe:
    httpGet:
      path: /healthz
      port: trace
    periodSeconds: {{ int $i.readinessProbe.periodSeconds }}
    failureThreshold: {{ int $i.readinessProbe.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: trace
    periodSeconds: {{ int $i.livenessProbe.periodSeconds }}
    failureThreshold: {{ int $i.livenessProbe.failureThreshold }}
  resources:
    {{- toYaml $t.resources | nindent 4 }}
  securityContext:
    {{- include "lmforge.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    {{- include "lmforge.traceCacheMount" . | nindent 4 }}
    - name: tmp
      mountPath: /tmp
    {{- if $i.apiKeys.secretName }}
    - name: api-keys
      mountPath: /var/run/secrets/lmforge/api-keys
      readOnly: true
    {{- end }}
{{- end -}}

{{/* A Kubernetes quantity (512Mi, 2Gi, 1.5G, 1e9, 4096) in bytes, as a float. */}}
{{- define "lmforge.quantityBytes" -}}
{{- $q := toString . -}}
{{- $suffix := regexFind "(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)$" $q -}}
{{- $units := dict "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0
      "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 -}}
{{- mulf (trimSuffix $suffix $q | float64) (get $units $suffix | default 1.0) -}}
{{- end -}}

{{/* Fails when the trace-index stage's memory limit (.stage.resources.limits.memory) is below what
     a task needs for the config's trace_index.part_tokens (.partTokens): about 20 bytes per part
     token while a part's suffix array is sorted (lmforge.dataprep.config.TraceIndexConfig), plus
     256Mi for the process itself. */}}
{{- define "lmforge.traceIndexMemoryCheck" -}}
{{- with (.stage.resources.limits | default dict).memory -}}
{{- $needed := addf (mulf (float64 $.partTokens) 20.0) 268435456.0 -}}
{{- if lt (include "lmforge.quantityBytes" . | float64) $needed -}}
{{- fail (printf "dataprep.stages.trace-index.resources.limits.memory (%v) is below what a task needs with dataprep.config.trace_index.part_tokens %v: about 20 bytes per part token plus 256Mi (%.0fMi); raise the limit or lower part_tokens" . (int64 $.partTokens) (divf $needed 1048576.0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
