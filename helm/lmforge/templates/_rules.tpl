{{- /*
The platform's Prometheus rules: recording rules the dashboards and alerts read, then one alert
group per service. Rendered twice with the same content: as a PrometheusRule
(prometheusrule.yaml) and as a plain rule file in a ConfigMap (rules-configmap.yaml).

Conventions:
- thresholds and `for:` come from .Values.alerts (documented there); alerts.forOverride, when
  set, replaces every `for:`;
- counters are read with their `_total` name, histograms with `_bucket`; nothing assumes a
  fleet size (no replica counts, per-replica or per-model thresholds only);
- series are selected by metric name; `job` is used only where a name is shared (`up`, the
  Pushgateway's push_time_seconds) and then with the fixed contract job names;
- Prometheus templates in annotations are written as Helm raw strings: {{`{{ $labels.x }}`}}.
*/ -}}

{{/* The runbook_url annotation line of alert .alert (a new line, indented as an annotation of
     lmforge.ruleGroups), or nothing when no base URL is set. */}}
{{- define "lmforge.runbookUrl" -}}
{{- with .root.Values.monitoring.runbookBaseUrl }}
        runbook_url: {{ printf "%s/docs/operations.md#%s" (trimSuffix "/" .) (lower $.alert) | quote }}
{{- end -}}
{{- end -}}

{{- define "lmforge.ruleGroups" -}}
{{- $w := .Values.monitoring.rateWindow -}}
{{- $override := .Values.alerts.forOverride -}}
{{- $i := .Values.alerts.inference -}}
{{- $c := .Values.alerts.canary -}}
{{- $t := .Values.alerts.training -}}
{{- $d := .Values.alerts.dataprep -}}
{{- /* Pushgateway groups of data-prep workers pushed recently (groups of old runs stay there). */ -}}
{{- $recent := printf "(time() - push_time_seconds{job=\"lmforge-dataprep\"} < %v * 3600)" $d.recentHours -}}
# -- Recording rules: what the dashboards plot and the alerts compare ----------------------
{{- if and .Values.inference.enabled (eq (.Values.inference.backend | default "lmforge") "vllm") }}
# vLLM's series (inference.backend vllm) recorded under the names lmforge-serve exposes, so the
# recording rules below, the alerts and the dashboards read them unchanged. Only rendered with
# backend vllm. Names: vLLM's production metrics (https://docs.vllm.ai/en/stable/usage/metrics/)
# as vllm/v1/metrics/loggers.py defines them, v0.10.1.1 to the pinned image's v0.31.0
# (inference.vllm.image); where releases name a series differently, both names are read (`or`:
# the first present wins): TPOT vllm:time_per_output_token_seconds (v0.10; deprecated in v0.11
# for vllm:inter_token_latency_seconds, the one v0.31 has), KV cache vllm:kv_cache_usage_perc
# (vllm:gpu_cache_usage_perc before v0.9, since removed), prefix-cache
# queries and hits (tokens) vllm:prefix_cache_{queries,hits}_total (vllm:gpu_prefix_cache_{queries,hits}_total
# before v0.9), preemptions vllm:num_preemptions_total. `engine` (the engine-core index) is summed away; job, instance, pod and model_name
# (--served-model-name) stay.
- name: lmforge.inference.vllm
  rules:
    {{- range $to, $from := dict
          "time_to_first_token_seconds_bucket" "vllm:time_to_first_token_seconds_bucket"
          "time_per_output_token_seconds_bucket" "vllm:time_per_output_token_seconds_bucket or vllm:inter_token_latency_seconds_bucket"
          "request_latency_seconds_bucket" "vllm:e2e_request_latency_seconds_bucket"
          "queue_time_seconds_bucket" "vllm:request_queue_time_seconds_bucket"
          "prefill_time_seconds_bucket" "vllm:request_prefill_time_seconds_bucket"
          "decode_time_seconds_bucket" "vllm:request_decode_time_seconds_bucket"
          "prompt_tokens_total" "vllm:prompt_tokens_total"
          "generation_tokens_total" "vllm:generation_tokens_total"
          "requests_running" "vllm:num_requests_running"
          "requests_waiting" "vllm:num_requests_waiting"
          "preemptions_total" "vllm:num_preemptions_total"
          "prefix_cache_queries_total" "vllm:prefix_cache_queries_total or vllm:gpu_prefix_cache_queries_total"
          "prefix_cache_hits_total" "vllm:prefix_cache_hits_total or vllm:gpu_prefix_cache_hits_total" }}
    - record: lmforge_inference_{{ $to }}
      expr: sum without (engine) ({{ $from }})
    {{- end }}
    - record: lmforge_inference_kv_cache_usage_ratio
      expr: max without (engine) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)
    - record: lmforge_inference_finished_requests_total
      expr: |
        sum without (engine, finished_reason) (
          label_replace(vllm:request_success_total, "finish_reason", "$1", "finished_reason", "(.*)")
        )
    # vLLM's engine series exist once its server is up, which is after the model has loaded.
    - record: lmforge_inference_model_info
      expr: group without (engine) (vllm:num_requests_running)
    # HTTP answers of the API (the server's prometheus-fastapi-instrumentator counter, status
    # grouped as 2xx/4xx/5xx), given the replica's model_name.
    - record: lmforge_inference_requests_total
      expr: |
        sum without (handler, method) (http_requests_total{job="lmforge-inference", handler=~"/v1/.+"})
        * on (job, instance) group_left (model_name)
        group by (job, instance, model_name) (vllm:num_requests_running)
{{- end }}
- name: lmforge.inference.recording
  rules:
    - record: lmforge:inference_requests:rate
      expr: sum by (model_name, status) (rate(lmforge_inference_requests_total[{{ $w }}]))
    # 0 (not "no data") while there is traffic but no 5xx series yet.
    - record: lmforge:inference_errors_5xx:ratio
      expr: |
        (
            sum by (model_name) (lmforge:inference_requests:rate{status=~"5.."})
          or
            sum by (model_name) (lmforge:inference_requests:rate) * 0
        )
        / sum by (model_name) (lmforge:inference_requests:rate)
    {{- range $q := list "50" "95" "99" }}
    - record: lmforge:inference_ttft_seconds:p{{ $q }}
      expr: histogram_quantile(0.{{ $q }}, sum by (model_name, le) (rate(lmforge_inference_time_to_first_token_seconds_bucket[{{ $w }}])))
    {{- end }}
    {{- range $q := list "50" "95" }}
    - record: lmforge:inference_tpot_seconds:p{{ $q }}
      expr: histogram_quantile(0.{{ $q }}, sum by (model_name, le) (rate(lmforge_inference_time_per_output_token_seconds_bucket[{{ $w }}])))
    {{- end }}
    {{- range $q := list "50" "95" }}
    - record: lmforge:inference_latency_seconds:p{{ $q }}
      expr: histogram_quantile(0.{{ $q }}, sum by (model_name, le) (rate(lmforge_inference_request_latency_seconds_bucket[{{ $w }}])))
    {{- end }}
    - record: lmforge:inference_queue_time_seconds:p95
      expr: histogram_quantile(0.95, sum by (model_name, le) (rate(lmforge_inference_queue_time_seconds_bucket[{{ $w }}])))
    - record: lmforge:inference_generation_tokens:rate
      expr: sum by (model_name) (rate(lmforge_inference_generation_tokens_total[{{ $w }}]))
    - record: lmforge:inference_prompt_tokens:rate
      expr: sum by (model_name) (rate(lmforge_inference_prompt_tokens_total[{{ $w }}]))
    - record: lmforge:inference_preemptions:rate
      expr: sum by (model_name) (rate(lmforge_inference_preemptions_total[{{ $w }}]))
    # Prompt tokens served from the prefix cache over those looked up (NaN while none is looked up).
    - record: lmforge:inference_prefix_cache_hits:ratio
      expr: |
        sum by (model_name) (rate(lmforge_inference_prefix_cache_hits_total[{{ $w }}]))
        / sum by (model_name) (rate(lmforge_inference_prefix_cache_queries_total[{{ $w }}]))
- name: lmforge.dataprep.recording
  rules:
    # Pushed counters: cumulative values per worker push, summed over the Pushgateway's groups.
    - record: lmforge:dataprep_documents:sum
      expr: sum by (stage, outcome) (lmforge_dataprep_documents_total)
    - record: lmforge:dataprep_drop:ratio
      expr: |
        lmforge:dataprep_documents:sum{outcome="dropped"}
        / ignoring (outcome) lmforge:dataprep_documents:sum{outcome="in"}
    - record: lmforge:dataprep_dropped_by_reason:ratio
      expr: |
        sum by (stage, reason) (lmforge_dataprep_dropped_documents_total)
        / on (stage) group_left lmforge:dataprep_documents:sum{outcome="in"}
- name: lmforge.training.recording
  rules:
    - record: lmforge:train_loss:avg_30m
      expr: avg_over_time(lmforge_train_loss[30m])
{{- if $i.enabled }}
# -- Inference ------------------------------------------------------------------------------
- name: lmforge.inference.alerts
  rules:
    - alert: LmforgeInferenceTTFTHigh
      expr: lmforge:inference_ttft_seconds:p95 > {{ $i.ttft.p95Seconds }}
      for: {{ $override | default $i.ttft.for }}
      labels:
        severity: warning
        service: inference
      annotations:
        summary: {{`'Time to first token p95 of {{ $labels.model_name }} above its SLO'`}}
        description: >-
          {{`The p95 time to first token of {{ $labels.model_name }} is {{ $value | humanizeDuration }}`}}
          (SLO {{ $i.ttft.p95Seconds }}s, over {{ $w }}).
        runbook: >-
          Check the queue first (lmforge_inference_requests_waiting, the queue-time p95): a long queue
          means too few replicas or too much traffic, so scale the Deployment out. With a short queue,
          look at prefill time (long prompts) and GPU utilization for a slow or throttled device.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferenceTTFTHigh") }}
    - alert: LmforgeInferenceTPOTHigh
      expr: lmforge:inference_tpot_seconds:p95 > {{ $i.tpot.p95Seconds }}
      for: {{ $override | default $i.tpot.for }}
      labels:
        severity: warning
        service: inference
      annotations:
        summary: {{`'Time per output token p95 of {{ $labels.model_name }} above its SLO'`}}
        description: >-
          {{`The p95 time per output token of {{ $labels.model_name }} is {{ $value | humanizeDuration }}`}}
          (SLO {{ $i.tpot.p95Seconds }}s, over {{ $w }}).
        runbook: >-
          Decoding is slow: check the running batch size (lmforge_inference_requests_running) against
          the KV-cache usage and GPU utilization. A full batch on every replica needs more replicas; a
          small batch with low GPU utilization points at the device or the node (CPU throttling, noisy
          neighbours).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferenceTPOTHigh") }}
    - alert: LmforgeInferenceErrorRateHigh
      expr: lmforge:inference_errors_5xx:ratio > {{ $i.errors.ratio }}
      for: {{ $override | default $i.errors.for }}
      labels:
        severity: critical
        service: inference
      annotations:
        summary: {{`'{{ $labels.model_name }} answers too many requests with 5xx'`}}
        description: >-
          {{`{{ $value | humanizePercentage }} of the requests to {{ $labels.model_name }} failed with a 5xx`}}
          (threshold {{ $i.errors.ratio }}, over {{ $w }}).
        runbook: >-
          Read the inference pods' logs (kubectl logs, level "error": every 500 is logged with its trace
          id) and open one trace. A failed engine or model load also shows on /readyz; a recent rollout
          of a new model version is the first suspect: roll it back.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferenceErrorRateHigh") }}
    - alert: LmforgeInferenceQueueSaturated
      expr: lmforge_inference_requests_waiting > {{ $i.queue.waiting }}
      for: {{ $override | default $i.queue.for }}
      labels:
        severity: warning
        service: inference
      annotations:
        summary: {{`'Requests queue up on {{ $labels.instance }} ({{ $labels.model_name }})'`}}
        description: >-
          {{`{{ $value }} requests are waiting for a slot on {{ $labels.instance }} ({{ $labels.model_name }})`}}
          (threshold {{ $i.queue.waiting }}); beyond max_waiting the server answers 429.
        runbook: >-
          The replica is at capacity: check the request rate and whether the HorizontalPodAutoscaler
          (if any) is at its maximum, then scale the Deployment out. If only one replica queues while
          others idle, check the Service's load balancing (long-lived streaming connections).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferenceQueueSaturated") }}
    - alert: LmforgeInferenceNoReadyReplicas
      # A replica counts once it is scraped and has loaded its model (lmforge_inference_model_info).
      expr: |
        absent(
            up{job="lmforge-inference"} == 1
          and on (job, instance)
            lmforge_inference_model_info == 1
        )
      for: {{ $override | default $i.noReadyReplicas.for }}
      labels:
        severity: critical
        service: inference
      annotations:
        summary: 'No inference replica is serving'
        description: >-
          No lmforge-inference target is up with a loaded model: the completions API is down.
        runbook: >-
          kubectl get pods -l app.kubernetes.io/component=inference, then describe a pod: pending
          (no GPU node, quota), crash-looping (kubectl logs --previous: the model package could not be
          fetched or loaded), or running but not ready (/readyz says why).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferenceNoReadyReplicas") }}
    - alert: LmforgeInferencePreemptionsHigh
      expr: |
        sum by (model_name) (rate(lmforge_inference_preemptions_total[{{ $w }}]))
        / sum by (model_name) (rate(lmforge_inference_finished_requests_total[{{ $w }}]))
        > {{ $i.preemptions.perRequest }}
      for: {{ $override | default $i.preemptions.for }}
      labels:
        severity: warning
        service: inference
      annotations:
        summary: {{`'{{ $labels.model_name }} preempts running sequences: its KV-cache pool is too small'`}}
        description: >-
          {{`{{ $value | printf "%.2f" }} preemptions per finished request on {{ $labels.model_name }}`}}
          (threshold {{ $i.preemptions.perRequest }}, over {{ $w }}): preempted sequences give up their
          KV-cache blocks and have their prefill recomputed later.
        runbook: >-
          Compare lmforge_inference_kv_cache_usage_ratio (near 1 on the preempting replicas) with the
          running batch (lmforge_inference_requests_running): give the engine more KV-cache memory
          (engine.kv_cache_bytes; with vLLM inference.vllm.gpuMemoryUtilization), or admit fewer
          sequences (engine.max_running; vLLM's --max-num-seqs) and scale out instead.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeInferencePreemptionsHigh") }}
{{- end }}
{{- if $c.enabled }}
# -- Canary ---------------------------------------------------------------------------------
- name: lmforge.canary.alerts
  rules:
    - alert: LmforgeCanaryRegression
      # Only models whose canary ran recently: the Pushgateway keeps retired models' groups.
      expr: |
        lmforge_canary_passed == 0
        and on (model)
        (time() - lmforge_canary_last_run_timestamp_seconds < {{ $c.staleHours }} * 3600)
      for: {{ $override | default $c.regression.for }}
      labels:
        severity: critical
        service: canary
      annotations:
        summary: {{`'The canary of {{ $labels.model }} failed: the deployed model regressed'`}}
        description: >-
          {{`The last canary run against {{ $labels.model }} did not pass`}} (lmforge_canary_passed is 0):
          its perplexity or score is outside the baseline's tolerance.
        runbook: >-
          Read the canary Job's report (kubectl logs of the last lmforge-canary job) and compare
          lmforge_canary_perplexity and lmforge_canary_score with the baseline. If the deployed model
          version changed since the baseline, roll back the inference Deployment or make a new baseline
          once the new model is judged good.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCanaryRegression") }}
    - alert: LmforgeCanaryStale
      expr: |
        time() - max(lmforge_canary_last_run_timestamp_seconds) > {{ $c.staleHours }} * 3600
        or
        absent(lmforge_canary_last_run_timestamp_seconds)
      for: {{ $override | default $c.stale.for }}
      labels:
        severity: warning
        service: canary
      annotations:
        summary: 'The canary has not run for more than {{ $c.staleHours }} h'
        description: >-
          The newest lmforge_canary_last_run_timestamp_seconds in the Pushgateway is older than
          {{ $c.staleHours }} h, or there is none: the deployed model is not being checked.
        runbook: >-
          kubectl get cronjob,jobs for the canary: a suspended CronJob, failed Jobs (kubectl logs: the
          endpoint unreachable, or the Pushgateway push failed), or a fresh install whose first run has
          not happened yet (start one with kubectl create job --from=cronjob/...).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCanaryStale") }}
    - alert: LmforgeCanaryMemorization
      # Pushed only by runs that traced their outputs (the server serves a trace index); a recent
      # run only, as for LmforgeCanaryRegression.
      expr: |
        lmforge_canary_memorized_token_ratio > {{ $c.memorizedTokenRatio }}
        and on (model)
        (time() - lmforge_canary_last_run_timestamp_seconds < {{ $c.staleHours }} * 3600)
      for: {{ $override | default $c.memorization.for }}
      labels:
        severity: warning
        service: canary
      annotations:
        summary: {{`'{{ $labels.model }} reproduces its training data verbatim'`}}
        description: >-
          {{`{{ $value | humanizePercentage }} of the tokens {{ $labels.model }} generated for the canary's checks`}}
          lie in long spans found verbatim in the training data (threshold {{ $c.memorizedTokenRatio }}).
        runbook: >-
          Read the canary Job's report (kubectl logs of the last lmforge-canary job): its memorization
          section lists the longest spans with their source URLs and counts. Spans repeated many times in
          the data point at duplicates that deduplication missed (boilerplate, mirrored pages): check the
          data-prep report's dedup figures. A model that memorizes rare passages is overfitting (too many
          epochs over a small corpus): compare with the previous model version before rolling it out.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCanaryMemorization") }}
{{- end }}
{{- if $t.enabled }}
# -- Training and checkpoint upload ---------------------------------------------------------
- name: lmforge.training.alerts
  rules:
    - alert: LmforgeTrainingStalled
      # While rank 0 is up (the job runs), the step counter has not moved; or rank 0 was up a
      # window ago too and no step at all since: lmforge_train_step is absent until the first
      # step, so a start or a restore that hangs before it has no series for changes() to read.
      expr: |
        (
            changes(lmforge_train_step[{{ $t.stalled.window }}]) == 0
          or on (job, instance)
            (
                up{job="lmforge-trainer"} offset {{ $t.stalled.window }} == 1
              unless on (job, instance)
                present_over_time(lmforge_train_step[{{ $t.stalled.window }}])
            )
        )
        and on (job, instance)
        up{job="lmforge-trainer"} == 1
      for: {{ $override | default $t.stalled.for }}
      labels:
        severity: critical
        service: training
      annotations:
        summary: {{`'Training on {{ $labels.instance }} is not making progress'`}}
        description: >-
          {{`lmforge_train_step on {{ $labels.instance }} has not changed`}} for {{ $t.stalled.window }}
          while the trainer is up.
        runbook: >-
          Look at the trainer pods' last log lines and lmforge_train_data_wait_seconds: a data wait
          means the shard store or prefetch is stuck; no log on one rank means a hung collective (NCCL)
          on one node: delete the training job's pods to restart from the last checkpoint.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeTrainingStalled") }}
    - alert: LmforgeTrainingLossSpike
      expr: lmforge_train_loss > {{ $t.lossSpike.factor }} * lmforge:train_loss:avg_30m
      for: {{ $override | default $t.lossSpike.for }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'Training loss spiked on {{ $labels.instance }}'`}}
        description: >-
          {{`The training loss is {{ $value | printf "%.3f" }}`}}, more than {{ $t.lossSpike.factor }} times
          its 30-minute average.
        runbook: >-
          Check lmforge_train_grad_norm and the learning rate at the spike: a grad-norm blow-up after a
          warm-up or a learning-rate change points at optimisation settings; a spike on particular
          steps points at bad data in a shard. If the loss does not come back, restart from the last
          good checkpoint with a lower learning rate or skip the data.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeTrainingLossSpike") }}
    - alert: LmforgeTrainingNonFiniteSteps
      expr: increase(lmforge_train_nonfinite_steps_total[{{ $t.nonfinite.window }}]) > {{ $t.nonfinite.maxSteps }}
      for: {{ $override | default $t.nonfinite.for }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'Training on {{ $labels.instance }} skips steps with a NaN/Inf loss or gradient'`}}
        description: >-
          Steps skipped for a non-finite loss or gradient in the last {{ $t.nonfinite.window }}:
          {{`about {{ $value | printf "%.0f" }}`}} (threshold {{ $t.nonfinite.maxSteps }}).
        runbook: >-
          Occasional skipped steps under mixed precision can be normal; a steady stream is not. Check the
          loss and grad norm before the first one, lower the learning rate or tighten gradient clipping,
          and restart from the last checkpoint if the loss has diverged.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeTrainingNonFiniteSteps") }}
    - alert: LmforgeTrainingMFULow
      # A trainer that does not know its device's peak FLOP/s (CPU, unknown GPU) exports no MFU.
      expr: lmforge_train_mfu_ratio < {{ $t.mfu.floor }}
      for: {{ $override | default $t.mfu.for }}
      labels:
        severity: info
        service: training
      annotations:
        summary: {{`'Model FLOPs utilization on {{ $labels.instance }} is low'`}}
        description: >-
          {{`MFU is {{ $value | humanizePercentage }}`}}, below the floor of {{ $t.mfu.floor }}.
        runbook: >-
          Compare lmforge_train_data_wait_seconds with lmforge_train_step_seconds (input-bound),
          lmforge_train_checkpoint_stall_seconds (checkpointing too often) and the per-rank step times
          (a slow node). Then the batch size and sequence length: small micro-batches underuse the GPU.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeTrainingMFULow") }}
    - alert: LmforgeCheckpointUploadStalled
      # Pending then and now, and no upload finished in between (needs the sidecar up that long).
      expr: |
        lmforge_uploader_pending_checkpoints > 0
        and lmforge_uploader_pending_checkpoints offset {{ $t.checkpointUpload.stalledAfter }} > 0
        and changes(lmforge_uploader_last_uploaded_step[{{ $t.checkpointUpload.stalledAfter }}]) == 0
      for: {{ $override | default $t.checkpointUpload.stalledFor }}
      labels:
        severity: critical
        service: training
      annotations:
        summary: {{`'Checkpoints on {{ $labels.instance }} are not reaching the object store'`}}
        description: >-
          {{`{{ $value }} committed checkpoints are waiting for upload`}} and none was uploaded in the last
          {{ $t.checkpointUpload.stalledAfter }}: a restart would lose that progress, and the local
          volume fills up.
        runbook: >-
          kubectl logs of the pod's checkpoint-uploader container: upload_failed / pass_failed lines name
          the store error (credentials, bucket, network, throttling). Check
          lmforge_uploader_failures_total by reason and free space on the checkpoint volume.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCheckpointUploadStalled") }}
    - alert: LmforgeCheckpointUploadSlow
      expr: lmforge_uploader_lag_seconds > {{ $t.checkpointUpload.lagSeconds }}
      for: {{ $override | default $t.checkpointUpload.lagFor }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'Checkpoint uploads on {{ $labels.instance }} lag behind training'`}}
        description: >-
          {{`The last checkpoint was uploaded {{ $value | humanizeDuration }} after it was committed`}}
          (threshold {{ $t.checkpointUpload.lagSeconds }}s).
        runbook: >-
          Uploads slower than the checkpoint interval pile up: compare lmforge_uploader_upload_seconds
          with the time between checkpoints, check the node's network bandwidth to the store and the
          uploader's retries (lmforge_uploader_failures_total), or checkpoint less often.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCheckpointUploadSlow") }}
    - alert: LmforgeCheckpointUploadFailing
      expr: |
        sum without (reason) (increase(lmforge_uploader_failures_total[{{ $t.checkpointUpload.failuresWindow }}]))
        > {{ $t.checkpointUpload.maxFailures }}
      for: {{ $override | default $t.checkpointUpload.failuresFor }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'Checkpoint uploads on {{ $labels.instance }} keep failing'`}}
        description: >-
          {{`About {{ $value | printf "%.0f" }} uploads or passes failed`}} in the last
          {{ $t.checkpointUpload.failuresWindow }} (the sidecar retries them).
        runbook: >-
          lmforge_uploader_failures_total by reason says what fails (credentials, throttling, a vanished
          checkpoint); the uploader container's logs carry the full error. Fix the store access before
          lmforge_uploader_pending_checkpoints grows.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeCheckpointUploadFailing") }}
    # The checkpoint evaluations (lmforge-train eval-checkpoint, pushed per run: the newest
    # evaluated checkpoint's scores beside the best of the checkpoints up to it). A later good
    # checkpoint resolves them.
    - alert: LmforgeEvalTaskRegression
      expr: lmforge_eval_task_best_score - lmforge_eval_task_score > {{ $t.evalScoreDrop }}
      for: {{ $override | default $t.evalFor }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'{{ $labels.task }} {{ $labels.metric }} of run {{ $labels.run }} dropped below its best checkpoint'`}}
        description: >-
          {{`The newest evaluated checkpoint of run {{ $labels.run }} scores {{ $value | printf "%.3f" }} less on`}}
          {{`{{ $labels.task }} ({{ $labels.metric }})`}} than the best checkpoint so far (threshold {{ $t.evalScoreDrop }}).
        runbook: >-
          Open the run's training report (report.html, section Checkpoint evaluations) or evals.jsonl: one
          regressed checkpoint among good ones points at that package (the eval job's log, the step's
          loss); a steady fall with a falling training loss is overfitting or a data-mixture change. The
          promoted checkpoint is never a regressed one (evals/best.json names it).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeEvalTaskRegression") }}
    - alert: LmforgeEvalHeldOutRegression
      expr: lmforge_eval_heldout_loss - lmforge_eval_heldout_best_loss > {{ $t.evalLossRise }}
      for: {{ $override | default $t.evalFor }}
      labels:
        severity: warning
        service: training
      annotations:
        summary: {{`'Held-out loss on {{ $labels.source }} of run {{ $labels.run }} rose above its best checkpoint'`}}
        description: >-
          {{`The newest evaluated checkpoint of run {{ $labels.run }} has a held-out loss on {{ $labels.source }}`}}
          {{`{{ $value | printf "%.3f" }} nats above the best checkpoint so far`}} (threshold {{ $t.evalLossRise }}).
        runbook: >-
          Compare the checkpoint's held-out loss with the training loss of the same step (report.html): a
          loss near ln(vocabulary size) is a broken package (zeroed or corrupt weights: check the weights
          package's sha256s and the trainer's log); a rise shared with the training loss is a divergence
          (LmforgeTrainingLossSpike). Keep serving the promoted checkpoint (evals/best.json).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeEvalHeldOutRegression") }}
{{- end }}
{{- if $d.enabled }}
# -- Data prep ------------------------------------------------------------------------------
- name: lmforge.dataprep.alerts
  rules:
    - alert: LmforgeDataprepWorkerFailures
      expr: |
        lmforge_dataprep_worker_failures_total > 0
        and on (worker)
        {{ $recent }}
      for: {{ $override | default $d.workerFailures.for }}
      labels:
        severity: warning
        service: dataprep
      annotations:
        summary: {{`'Data-prep worker {{ $labels.worker }} reported failures'`}}
        description: >-
          {{`Worker {{ $labels.worker }}, phase {{ $labels.phase }}: {{ $value }} failed inputs or tasks`}},
          pushed within the last {{ $d.recentHours }} h.
        runbook: >-
          kubectl logs of the worker's pod (the Indexed Job's completion index is the worker label):
          the inputs that failed and why (unreadable or truncated WET files, store errors). Rerun the
          data-prep step: completed inputs are skipped, the failed ones are retried.
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeDataprepWorkerFailures") }}
    - alert: LmforgeDataprepDropRateAnomalous
      expr: |
        abs(
            (
                sum by (stage) (lmforge_dataprep_documents_total{outcome="dropped"} and on (worker) {{ $recent }})
              / sum by (stage) (lmforge_dataprep_documents_total{outcome="in"} and on (worker) {{ $recent }})
            )
          - on (stage)
            avg_over_time(lmforge:dataprep_drop:ratio[{{ $d.dropRate.usualWindow }}] offset {{ $d.recentHours }}h)
        ) > {{ $d.dropRate.tolerance }}
        and on (stage)
        sum by (stage) (lmforge_dataprep_documents_total{outcome="in"} and on (worker) {{ $recent }}) >= {{ $d.dropRate.minDocuments }}
      for: {{ $override | default $d.dropRate.for }}
      labels:
        severity: warning
        service: dataprep
      annotations:
        summary: {{`'Data-prep stage {{ $labels.stage }} drops an unusual share of documents'`}}
        description: >-
          {{`The drop ratio of stage {{ $labels.stage }} in the recent pushes is {{ $value | humanizePercentage }}`}}
          (absolute) away from its usual value (tolerance {{ $d.dropRate.tolerance }}).
        runbook: >-
          Compare lmforge:dataprep_dropped_by_reason:ratio for the stage with earlier runs, then the run's
          report.html and rejects/*.parquet: a jump usually means a changed config or threshold, another
          input (language mix, crawl), or a broken model file (e.g. the language-ID model).
        {{- include "lmforge.runbookUrl" (dict "root" $ "alert" "LmforgeDataprepDropRateAnomalous") }}
{{- end }}
{{- end -}}
