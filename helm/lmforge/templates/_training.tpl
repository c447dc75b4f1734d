{{/* The training run's objects: trainer.yaml (PyTorchJob) and trainjob.yaml (TrainJob and its
     TrainingRuntime) share these, and lmforge.trainerPod (trainer.yaml). The train pipeline's
     launcher renders the same templates for its runs (pipelines/src/lmforge_pipelines/launcher.py). */}}

{{/* The training job's name (the PyTorchJob; the TrainJob and its TrainingRuntime):
     <fullname>-train-<run>, at most 50 characters, because the operators name pods and Services
     after it (<job>-worker-<index>, <job>-node-0-<index>) and a host name is a DNS label. */}}
{{- define "lmforge.trainingJobName" -}}
{{- include "lmforge.runName" (dict "root" . "component" "train" "run" .Values.training.run "max" 50) -}}
{{- end -}}

{{/* Labels of the training job and its pods: the trainer component's, the run's, and the Kueue
     queue on the job itself (arguments: dict "root" $ "job" true|false). */}}
{{- define "lmforge.trainingLabels" -}}
{{ include "lmforge.labels" (dict "root" .root "component" "trainer") }}
lmforge.io/run: {{ include "lmforge.dnsLabel" .root.Values.training.run | trunc 63 | trimSuffix "-" | quote }}
{{- with .root.Values.training.scheduling.kueue.queueName }}
{{- if $.job }}
# Kueue admits the whole job at once (all pods' resources) or keeps it suspended.
kueue.x-k8s.io/queue-name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* What every training job needs of the values; fails with the value to fix. */}}
{{- define "lmforge.trainingChecks" -}}
{{- $t := .Values.training -}}
{{- $nodes := int $t.nodes -}}
{{- if and (gt $nodes 1) (not $t.checkpoints.persistentVolumeClaim) }}
{{- fail (printf "training.nodes is %d: a multi-node run needs training.checkpoints.persistentVolumeClaim (a ReadWriteMany claim), because every rank writes its checkpoint shards into one shared directory" $nodes) }}
{{- end }}
{{- if $t.elastic.enabled }}
{{- if eq $t.operator "trainjob" }}
{{- fail "training.elastic: Kubeflow Trainer v2 (training.operator trainjob) has no elastic training; use operator pytorchjob or turn elastic off" }}
{{- end }}
{{- if or (gt (int $t.elastic.minNodes) $nodes) (lt (int $t.elastic.maxNodes) $nodes) }}
{{- fail (printf "training.elastic: minNodes (%v) ≤ nodes (%d) ≤ maxNodes (%v) must hold" $t.elastic.minNodes $nodes $t.elastic.maxNodes) }}
{{- end }}
{{- end }}
{{- if and (eq $t.operator "trainjob") (not (has $t.restartPolicy (list "OnFailure" "Never"))) }}
{{- fail (printf "training.restartPolicy %s: a TrainJob's pods belong to a Job, which allows OnFailure or Never" $t.restartPolicy) }}
{{- end }}
{{- $s := $t.scheduling }}
{{- if and $s.kueue.queueName $s.volcano.queue }}
{{- fail "training.scheduling: set kueue.queueName or volcano.queue, not both (Kueue admits jobs for the default scheduler; Volcano schedules them itself)" }}
{{- end }}
{{- if and $s.volcano.queue (eq $t.operator "trainjob") (int $s.volcano.minAvailable) (ne (int $s.volcano.minAvailable) $nodes) }}
{{- fail (printf "training.scheduling.volcano.minAvailable %v: Trainer v2 gangs every pod of a TrainJob (%d); leave it 0" $s.volcano.minAvailable $nodes) }}
{{- end }}
{{- if gt (int $s.volcano.minAvailable) $nodes }}
{{- fail (printf "training.scheduling.volcano.minAvailable %v is more than the job's %d pods" $s.volcano.minAvailable $nodes) }}
{{- end }}
{{- include "lmforge.checkOwned" (dict "section" "training.config" "values" $t.config "owned" (dict
      "run_dir" "set training.run (RUN_DIR is /checkpoints/<run>)"
      "data.cache_dir" "s3:// sources are streamed through a block cache on the /cache volume (training.dataCacheSizeLimit)"
      "metrics.port" "set training.metricsPort"
      "device" "set training.gpusPerProcess (0: cpu, 1: cuda)"
      "checkpoint.purge_requires_upload" "true exactly when training.uploader.enabled"
      "checkpoint.weights_every" "set training.evaluation.weightsEvery (with training.evaluation.enabled)"
      "checkpoint.weights_every_minutes" "set training.evaluation.weightsEveryMinutes (with training.evaluation.enabled)"
      "checkpoint.weights_keep" "set training.evaluation.weightsKeep (with training.evaluation.enabled)")) }}
{{- include "lmforge.checkOwned" (dict "section" "training.uploader.config" "values" $t.uploader.config "owned" (dict
      "metrics_port" "set training.uploader.metricsPort"
      "grace_seconds" "set training.uploader.graceSeconds"
      "identity" "the chart names each sidecar after its pod"
      "evaluation" "set training.evaluation")) }}
{{- include "lmforge.evaluationChecks" . }}
{{- end -}}

{{/* What evaluation branches (training.evaluation) need of the values; nothing when they are off. */}}
{{- define "lmforge.evaluationChecks" -}}
{{- $t := .Values.training -}}
{{- $e := $t.evaluation -}}
{{- if $e.enabled }}
{{- if not $t.uploader.enabled }}
{{- fail "training.evaluation needs training.uploader.enabled: the uploader sidecar uploads the weights packages and launches their evaluation Jobs" }}
{{- end }}
{{- if not (or (gt (int $e.weightsEvery) 0) (gt (float64 $e.weightsEveryMinutes) 0.0)) }}
{{- fail "training.evaluation: set weightsEvery (steps) or weightsEveryMinutes, or both: with neither only the final step is evaluated" }}
{{- end }}
{{- if and (eq $e.promote.mode "pointer") (not (and $e.promote.pointer $e.promote.modelsStore)) }}
{{- fail "training.evaluation.promote.mode pointer copies the best package under training.evaluation.promote.modelsStore and points training.evaluation.promote.pointer at it: set both" }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The name of the run's evaluation Job template ConfigMap: <fullname>-eval-job-<run>. */}}
{{- define "lmforge.evalJobTemplateName" -}}
{{- include "lmforge.runName" (dict "root" . "component" "eval-job" "run" .Values.training.run) -}}
{{- end -}}

{{/* The uploader sidecar's evaluation config (UploaderConfig.evaluation) as --set overrides. */}}
{{- define "lmforge.uploaderEvaluationOverrides" -}}
{{- $e := .Values.training.evaluation -}}
{{- $rules := .Values.alerts.training -}}
{{- $evaluation := dict
      "enabled" true
      "runner" "kubernetes"
      "job_template" "/etc/lmforge/eval-job/job.json"
      "max_concurrent" (int $e.maxConcurrent)
      "score" $e.score
      "mode" $e.mode
      "score_drop" $rules.evalScoreDrop
      "loss_rise" $rules.evalLossRise
      "promote" $e.promote.mode
      "pointer" ($e.promote.pointer | default "")
      "models_store" ($e.promote.modelsStore | default "")
      "run" .Values.training.run -}}
{{- include "lmforge.overrides" (dict "values" (dict "evaluation" $evaluation "weights_keep" (int $e.weightsKeep)) "flag" "--set") -}}
{{- end -}}

{{/* LMFORGE_NODE_RANK: a TrainJob pod's node rank, its Indexed Job's completion index (what
     Trainer v2 sets PET_NODE_RANK from too), for `lmforge-uploader --node-rank`. */}}
{{- define "lmforge.nodeRankEnv" -}}
- name: LMFORGE_NODE_RANK
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
{{- end -}}
