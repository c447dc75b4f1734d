{{- /*
The inference pod's containers and volumes with inference.backend vllm (templates/inference.yaml
keeps the Deployment, Service, HPA and PDB of both backends):

- init container `fetch-model` (the lmforge inference image): `python -m
  lmforge.inference.fetch_model` resolves inference.model (pointer or package), checks that it is
  a verified Hugging Face format package and downloads it to the `model` emptyDir;
- container `inference`: vLLM's OpenAI server (inference.vllm.image) on that directory, on
  inference.port, which serves the API, /health, /v1/models and /metrics
  (https://docs.vllm.ai/en/stable/usage/metrics/). The API key is the first line of the keys
  file, exported as VLLM_API_KEY (vLLM takes one key; `--api-key` in argv would show in ps);
- non-root like every lmforge pod (the image's default user is root): HOME and every cache vLLM,
  torch, Triton and Hugging Face write go to the `cache` emptyDir; /dev/shm is a memory emptyDir;
- with inference.trace, container `trace` (templates/_trace.tpl): the lmforge inference image's
  standalone trace service, serving /v1/trace on inference.trace.tracePort from the `trace-cache`
  emptyDir, with the same API keys file.

vLLM loads the model once: a moved pointer reaches it only through new pods. The rollout
(lmforge_pipelines.rollout) restarts the Deployment after moving the pointer (the pod template's
kubectl.kubernetes.io/restartedAt, as `kubectl rollout restart`); this template names the pointer,
never a package, so `helm upgrade` renders the same pod and new pods fetch the rolled-out model.
*/ -}}
{{- define "lmforge.vllmPod" -}}
{{- $root := .root -}}
{{- $i := $root.Values.inference -}}
{{- $v := $i.vllm -}}
{{- $keys := "/var/run/secrets/lmforge/api-keys/keys" -}}
{{- $servedName := $i.modelName | default (base (trimSuffix "/" $i.model)) -}}
{{- $trace := include "lmforge.traceEnabled" $root | eq "true" -}}
initContainers:
  - name: fetch-model
    image: {{ include "lmforge.image" (dict "root" $root "service" "inference") }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: [python, -m, lmforge.inference.fetch_model]
    args:
      - --model
      - {{ $i.model | quote }}
      - --output
      - /models/served
    env:
      {{- include "lmforge.env" $root | nindent 6 }}
    resources:
      requests: {cpu: 500m, memory: 512Mi}
      limits: {cpu: "2", memory: 1Gi}
    securityContext:
      {{- include "lmforge.containerSecurityContext" $root | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: /models
      - name: tmp
        mountPath: /tmp
containers:
  - name: inference
    image: {{ $v.image }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command:
      - /bin/sh
      - -c
      - |
        {{- if $i.apiKeys.secretName }}
        # The first non-blank line not starting with '#', as the canary reads it.
        VLLM_API_KEY="$(sed -n '/^[[:space:]]*#/d; /[^[:space:]]/{s/^[[:space:]]*//; s/[[:space:]]*$//; p; q; }' {{ $keys }})"
        [ -n "$VLLM_API_KEY" ] || { echo "{{ $keys }}: no API key in the keys file" >&2; exit 2; }
        export VLLM_API_KEY
        {{- end }}
        exec vllm serve "$@"
      - vllm
    args:
      - /models/served
      - --served-model-name
      - {{ $servedName | quote }}
      - --host
      - 0.0.0.0
      - --port
      - {{ $i.port | toString | quote }}
      - --dtype
      - {{ $v.dtype | default "auto" | quote }}
      {{- if gt (int $v.maxModelLen) 0 }}
      - --max-model-len
      - {{ int $v.maxModelLen | toString | quote }}
      {{- end }}
      - --gpu-memory-utilization
      - {{ $v.gpuMemoryUtilization | toString | quote }}
      - --tensor-parallel-size
      - {{ int $v.tensorParallelSize | toString | quote }}
      {{- if not $i.apiDocs }}
      - --disable-fastapi-docs
      {{- end }}
      {{- range $v.extraArgs }}
      - {{ . | quote }}
      {{- end }}
    ports:
      - name: http
        containerPort: {{ int $i.port }}
        protocol: TCP
    env:
      - name: HOME
        value: /home/vllm
      - name: XDG_CACHE_HOME
        value: /home/vllm/.cache
      - name: HF_HOME
        value: /home/vllm/.cache/huggingface
      - name: VLLM_CACHE_ROOT
        value: /home/vllm/.cache/vllm
      - name: TRITON_CACHE_DIR
        value: /home/vllm/.cache/triton
      # Everything is local: never reach the Hugging Face Hub.
      - name: HF_HUB_OFFLINE
        value: "1"
      - name: VLLM_NO_USAGE_STATS
        value: "1"
      - name: DO_NOT_TRACK
        value: "1"
    {{- $startup := $i.startupProbe }}
    # /health answers 200 once the engine is up (vLLM's server starts serving only after the model
    # is loaded); the same probes as lmforge-serve's /readyz and /healthz.
    startupProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: {{ int $startup.periodSeconds }}
      timeoutSeconds: {{ int $startup.timeoutSeconds }}
      failureThreshold: {{ int (ceil (divf (int $startup.loadTimeoutSeconds) (int $startup.periodSeconds))) }}
    readinessProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: {{ int $i.readinessProbe.periodSeconds }}
      failureThreshold: {{ int $i.readinessProbe.failureThreshold }}
    livenessProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: {{ int $i.livenessProbe.periodSeconds }}
      failureThreshold: {{ int $i.livenessProbe.failureThreshold }}
    resources:
      {{- $resources := deepCopy $i.resources }}
      {{- $_ := set $resources "limits" (merge (dict $i.gpuResource (toString $i.gpus)) ($resources.limits | default dict)) }}
      {{- $_ := set $resources "requests" (merge (dict $i.gpuResource (toString $i.gpus)) ($resources.requests | default dict)) }}
      {{- toYaml $resources | nindent 6 }}
    securityContext:
      {{- include "lmforge.containerSecurityContext" $root | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: /models
        readOnly: true
      - name: cache
        mountPath: /home/vllm
      - name: tmp
        mountPath: /tmp
      - name: shm
        mountPath: /dev/shm
      {{- if $i.apiKeys.secretName }}
      - name: api-keys
        mountPath: /var/run/secrets/lmforge/api-keys
        readOnly: true
      {{- end }}
  {{- if $trace }}
  {{- include "lmforge.traceContainer" $root | nindent 2 }}
  {{- end }}
volumes:
  # The Hugging Face format package (inference.tmpSizeLimit).
  - name: model
    emptyDir:
      sizeLimit: {{ $i.tmpSizeLimit }}
  - name: cache
    emptyDir:
      sizeLimit: 10Gi
  - name: tmp
    emptyDir:
      sizeLimit: 1Gi
  - name: shm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $v.shmSizeLimit }}
  {{- if $i.apiKeys.secretName }}
  - name: api-keys
    secret:
      secretName: {{ $i.apiKeys.secretName }}
      items:
        - key: {{ $i.apiKeys.key }}
          path: keys
  {{- end }}
  {{- if $trace }}
  {{- include "lmforge.traceCacheVolume" $root | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Refuse settings the vLLM backend cannot honour, each with the value to change. */}}
{{- define "lmforge.vllmChecks" -}}
{{- $i := .Values.inference -}}
{{- if $i.config }}
{{- fail "inference.config is lmforge-serve's configuration: with inference.backend vllm set inference.vllm.extraArgs instead" }}
{{- end }}
{{- if lt (int $i.gpus) 1 }}
{{- fail "inference.backend vllm needs inference.gpus >= 1 (vLLM's image serves on GPUs only)" }}
{{- end }}
{{- if lt (int $i.gpus) (int $i.vllm.tensorParallelSize) }}
{{- fail (printf "inference.vllm.tensorParallelSize (%v) exceeds inference.gpus (%v)" $i.vllm.tensorParallelSize $i.gpus) }}
{{- end }}
{{- end -}}
