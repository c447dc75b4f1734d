"""The Helm chart's values (helm/lmforge/values.yaml) outside the services' `config:` sections:
their keys, types, bounds and descriptions, from which values.schema.json is generated
(lmforge.tooling.values_schema, `make docs`).

Each section is a TypedDict: a key may be left out unless marked Required (Helm merges the
user's values over values.yaml, which holds every default; a key set to null is dropped, and
Required keys are the ones the templates cannot do without). Every section refuses unknown
keys but the dependency charts' (opentelemetry-collector: …), which are those charts' values.
A service's `config:` is marked with `service_config(TheServiceConfig, …)`: the generator puts the
schema of that pydantic model there (SERVICE_CONFIGS resolves the marker).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required

from pydantic import BaseModel, ConfigDict, Field, with_config
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from lmforge.canary.config import CanaryConfig
from lmforge.dataprep.config import DataprepConfig
from lmforge.inference.config import ServeConfig
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.config import UploaderConfig

SERVICE_CONFIG = "x-lmforge-service-config"  # the marker's key in the generated JSON schema

DNS_LABEL = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"  # or ""
QUANTITY = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"
DURATION = r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"  # a Prometheus duration
HTTP_URL = r"^(https?://.+)?$"  # or ""
S3_PREFIX = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
REPOSITORY = r"^[a-z0-9][a-z0-9._/-]*$"
QUEUE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"  # or ""


def service_config(model: type[BaseModel], description: str) -> FieldInfo:
    """A service's `config:` (nested keys the chart passes as key=value overrides), validated by
    the schema of the service's pydantic config `model` (the marker names it, "module:Class")."""
    marker = f"{model.__module__}:{model.__qualname__}"
    return Field(description=description, json_schema_extra={SERVICE_CONFIG: marker})


SERVICE_CONFIGS: dict[str, type[BaseModel]] = {
    f"{model.__module__}:{model.__qualname__}": model
    for model in (DataprepConfig, UploaderConfig, TrainConfig, ServeConfig, CanaryConfig)}


Port = Annotated[int, Field(ge=1, le=65535)]
Quantity = Annotated[
    Annotated[str, Field(pattern=QUANTITY)] | Annotated[float, Field(ge=0)],
    Field(description="a quantity, e.g. 500m, 2, 4Gi"),
]
Duration = Annotated[str, Field(pattern=DURATION)]
Holds = Annotated[Duration, Field(description="how long the condition holds before the alert fires")]
For = Annotated[Holds, Field(alias="for")]  # `for:`, a Python keyword
Labels = dict[str, str]
Object = dict[str, Any]  # a Kubernetes object the chart passes on as it is


class Section(TypedDict, total=False):
    __pydantic_config__ = ConfigDict(extra="forbid")


# -- shared shapes ---------------------------------------------------------------------------------


class Resources(Section, total=False):
    """Both requests and limits are required (every container has them)."""

    requests: Required[Annotated[dict[str, Quantity], Field(description="minimum guaranteed (cpu, memory, …)")]]
    limits: Required[Annotated[dict[str, Quantity], Field(description="maximum allowed (cpu, memory, …)")]]


class PodPlacement(Section, total=False):
    podAnnotations: Annotated[Labels, Field(description="extra pod annotations")]
    nodeSelector: Annotated[Labels, Field(description="pod nodeSelector")]
    tolerations: Annotated[list[Object], Field(description="pod tolerations")]
    affinity: Annotated[Object, Field(description="pod affinity")]
    priorityClassName: Annotated[str, Field(description='pod priorityClassName ("" = none)')]


class SecretKey(Section, total=False):
    secretName: Required[str]
    key: Required[Annotated[str, Field(min_length=1)]]


class Enabled(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create it")]]


class Dependency(TypedDict, total=False):
    """A dependency chart's values: its own, passed on unchecked."""

    __pydantic_config__ = ConfigDict(extra="allow")
    enabled: Required[Annotated[bool, Field(description="install this dependency chart")]]


# -- images, identity, network -----------------------------------------------------------------------


class Image(Section, total=False):
    registry: Annotated[str, Field(pattern=r"^([^/\s]+(/[^\s]*)?)?$",
                                   description='registry prefixed to every repository in images ("" = as written)')]
    tag: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$|^$",
                              description="tag of every lmforge image (\"\" = the chart's appVersion)")]
    pullPolicy: Required[Annotated[Literal["Always", "IfNotPresent", "Never"], Field(description="image pull policy")]]
    pullSecrets: Annotated[list[Annotated[str, Field(min_length=1, description="a Secret name")]],
                           Field(description="names of docker-registry Secrets")]


Repository = Annotated[str, Field(min_length=1, pattern=REPOSITORY)]


class Images(Section, total=False):
    dataprep: Required[Annotated[Repository, Field(description="repository of the dataprep image")]]
    trainer: Required[Annotated[Repository, Field(description="repository of the trainer image")]]
    uploader: Required[Annotated[Repository, Field(description="repository of the uploader image")]]
    inference: Required[Annotated[Repository, Field(description="repository of the inference image")]]
    canary: Required[Annotated[Repository, Field(description="repository of the canary image")]]


class SeccompProfile(Section, total=False):
    type: Required[Annotated[Literal["RuntimeDefault", "Localhost"], Field(description="profile type")]]
    localhostProfile: Annotated[str, Field(description="profile file (type Localhost)")]


class PodSecurityContext(Section, total=False):
    runAsUser: Annotated[int, Field(ge=1, description="uid the containers run as (non-root)")]
    runAsGroup: Annotated[int, Field(ge=0, description="primary gid")]
    fsGroup: Annotated[int, Field(ge=0, description="gid owning mounted volumes")]
    fsGroupChangePolicy: Annotated[Literal["OnRootMismatch", "Always"],
                                   Field(description="when volume ownership is changed")]
    supplementalGroups: Annotated[list[Annotated[int, Field(ge=0)]], Field(description="extra gids")]
    seccompProfile: Annotated[SeccompProfile, Field(description="seccomp profile")]


class S3(Section, total=False):
    endpointUrl: Annotated[str, Field(pattern=HTTP_URL,
                                      description='S3-compatible endpoint URL (AWS_ENDPOINT_URL); "" = AWS')]
    region: Annotated[str, Field(description="AWS_DEFAULT_REGION (\"\" = the SDK's default chain)")]
    credentialsSecret: Annotated[str, Field(description='existing Secret with the access key pair ("" = pod identity)')]
    accessKeyIdKey: Required[Annotated[str, Field(min_length=1, description="key of the access key id in that Secret")]]
    secretAccessKeyKey: Required[Annotated[str, Field(min_length=1,
                                                      description="key of the secret access key in that Secret")]]


class ServiceAccount(Section, total=False):
    create: Required[Annotated[bool, Field(description="create the ServiceAccounts")]]
    name: Annotated[str, Field(description='name ("" = <release>-workloads)')]
    annotations: Annotated[Labels, Field(description="annotations (IRSA, workload identity)")]


class Rbac(Section, total=False):
    create: Required[Annotated[bool, Field(description="create the pipeline runner's Role and RoleBinding")]]


class Subject(Section, total=False):
    kind: Required[Annotated[Literal["ServiceAccount", "User", "Group"], Field(description="subject kind")]]
    name: Required[Annotated[str, Field(min_length=1, description="subject name")]]
    namespace: Annotated[str, Field(description="namespace (ServiceAccount)")]
    apiGroup: Annotated[str, Field(description="API group (User, Group: rbac.authorization.k8s.io)")]


class PipelineRunner(Section, total=False):
    enabled: Required[Annotated[bool, Field(
        description="create the pipeline runner's ServiceAccount (serviceAccount.create) and Role (rbac.create)")]]
    name: Annotated[str, Field(description='ServiceAccount name ("" = <release>-pipeline-runner)')]
    annotations: Annotated[Labels, Field(description="ServiceAccount annotations")]
    additionalSubjects: Annotated[list[Annotated[Subject, Field(description="an RBAC subject")]],
                                  Field(description="more RoleBinding subjects")]


Selector = Annotated[Object, Field(description="a label selector (matchLabels / matchExpressions)")]


class NetworkPolicyPeer(Section, total=False):
    podSelector: Selector
    namespaceSelector: Selector
    ipBlock: Annotated[Object, Field(description="an IP block (cidr, except)")]


Peers = list[Annotated[NetworkPolicyPeer, Field(description="a NetworkPolicyPeer")]]


class NetworkPolicy(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create the NetworkPolicies")]]
    ingressFrom: Annotated[Peers, Field(
        description="peers allowed to the inference API port (the gateway / ingress controller)")]
    prometheusFrom: Annotated[Peers, Field(description="peers allowed to the metrics ports (Prometheus)")]


class Telemetry(Section, total=False):
    otlpEndpoint: Annotated[str, Field(pattern=HTTP_URL, description="OTLP/HTTP endpoint for traces")]
    pushgateway: Annotated[str, Field(pattern=HTTP_URL,
                                      description="Pushgateway URL for the canary and the data-prep workers")]


# -- data prep ---------------------------------------------------------------------------------------


class DataprepStage(Section, total=False):
    """A global stage of one task (a Job of one pod)."""

    backoffLimit: Required[Annotated[int, Field(ge=0, description="retries before the Job fails")]]
    tmpSizeLimit: Required[Annotated[str, Field(pattern=QUANTITY, description="size limit of the /tmp emptyDir")]]
    resources: Required[Annotated[Resources, Field(description="resources of a pod")]]


class DataprepIndexedStage(DataprepStage, total=False):
    """A global stage split over an Indexed Job's pods (backoffLimit: per index)."""

    tasks: Required[Annotated[int, Field(ge=1, le=10000, description=(
        "Indexed-Job completions: the stage's tasks are split into this many slices (--num-workers)"))]]
    parallelism: Required[Annotated[int, Field(ge=1, le=10000, description="pods running at once (≤ tasks)")]]
    processes: Required[Annotated[int, Field(ge=1, le=256, description="local processes per pod (--workers)")]]
    scratch: Annotated[str, Field(pattern=QUANTITY, description=(
        "size limit of a /scratch emptyDir, the pods' TMPDIR (unset: none; trace-index builds its index there)"))]


# One entry per global stage of lmforge.dataprep.stages (tests/deploy/test_chart_render.py holds them equal),
# under the stage's name: "trace-index" is no Python name, hence the functional form.
DataprepStages = with_config(ConfigDict(extra="forbid"))(TypedDict("DataprepStages", {
    "combine": Required[Annotated[DataprepIndexedStage, Field(
        description="dedup keys gathered per input group and range of dedup partitions")]],
    "dedup": Required[Annotated[DataprepIndexedStage, Field(description="dedup, by dedup partition")]],
    "components": Required[Annotated[DataprepIndexedStage, Field(description=(
        "the duplicate clusters' connected components, one Indexed Job per round (config components.max_rounds), "
        "by share of the graph's nodes"))]],
    "tokenizer": Required[Annotated[DataprepStage, Field(description="tokenizer training (one task)")]],
    "tokenize": Required[Annotated[DataprepIndexedStage, Field(description="tokenization, by input")]],
    "shards": Required[Annotated[DataprepIndexedStage, Field(description="shard writing, by shard partition")]],
    "trace-index": Required[Annotated[DataprepIndexedStage, Field(description=(
        "the trace index (suffix arrays), by shard partition; a Job only with config trace_index.enabled"))]],
    "report": Required[Annotated[DataprepStage, Field(description="manifest and report (one task)")]],
}, total=False))


class Dataprep(PodPlacement, total=False):
    enabled: Required[Annotated[bool, Field(description="run data prep from the chart")]]
    run: Annotated[str, Field(pattern=DNS_LABEL, max_length=40, description=(
        "run name in the Jobs' names and the lmforge.io/run label (\"\" = the output's last segment)"))]
    input: Required[Annotated[
        list[Annotated[str, Field(pattern=r"^(s3|https?)://.+", description="an input URI")]],
        Field(min_length=1, description="WET inputs: s3:// URIs (globs allowed) or https:// URLs")]]
    output: Required[Annotated[str, Field(pattern=S3_PREFIX, description="output prefix (s3://BUCKET/PREFIX)")]]
    workers: Required[Annotated[int, Field(ge=1, le=10000, description="Indexed-Job completions (input slices)")]]
    parallelism: Required[Annotated[int, Field(ge=1, le=10000, description="workers running at once (≤ workers)")]]
    processesPerWorker: Required[Annotated[int, Field(ge=1, le=256,
                                                      description="local processes per worker pod (--workers)")]]
    backoffLimitPerIndex: Annotated[int, Field(ge=0, description="retries of one failed worker index")]
    maxFailedIndexes: Annotated[int, Field(ge=0, description="failed indexes tolerated before the Job fails")]
    config: Annotated[Object, service_config(
        DataprepConfig, "data-prep config (nested keys, passed as key=value overrides)")]
    tmpSizeLimit: Annotated[str, Field(pattern=QUANTITY, description="size limit of the /tmp emptyDir")]
    resources: Required[Annotated[Resources, Field(description="resources of a worker")]]
    stages: Required[Annotated[DataprepStages, Field(
        description="the global stages, one Job each (post-install/post-upgrade hooks, in order)")]]


# -- training ------------------------------------------------------------------------------------------


class Elastic(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="add an elasticPolicy")]]
    minNodes: Required[Annotated[int, Field(ge=1, description="fewest pods (Master included) training continues with")]]
    maxNodes: Required[Annotated[int, Field(ge=1, description="most pods (Master included)")]]
    maxRestarts: Required[Annotated[int, Field(ge=0, description="worker-group restarts before torchrun gives up")]]


class Checkpoints(Section, total=False):
    sizeLimit: Required[Annotated[str, Field(pattern=QUANTITY,
                                             description="size limit of the per-pod checkpoint emptyDir")]]
    persistentVolumeClaim: Annotated[str, Field(
        description="existing ReadWriteMany claim shared by every pod (required when nodes > 1)")]


class Uploader(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="restore from and upload to the object store")]]
    metricsPort: Required[Annotated[Port, Field(
        description="the sidecar's /metrics port (port name uploader-metrics)")]]
    graceSeconds: Required[Annotated[int, Field(ge=0, le=86400,
                                                description="time to finish the upload in flight on shutdown")]]
    config: Annotated[Object, service_config(
        UploaderConfig, "uploader config (nested keys, passed as key=value overrides)")]
    resources: Required[Annotated[Resources, Field(description="resources of the restore and uploader containers")]]


class Kueue(Section, total=False):
    queueName: Required[Annotated[str, Field(pattern=QUEUE_NAME, max_length=63, description=(
        'LocalQueue name, the job\'s kueue.x-k8s.io/queue-name label ("" = no Kueue)'))]]


class Volcano(Section, total=False):
    queue: Required[Annotated[str, Field(pattern=QUEUE_NAME, description='Volcano queue ("" = no Volcano)')]]
    minAvailable: Required[Annotated[int, Field(ge=0,
                                                description="pods that must fit at once (PyTorchJob; 0 = every pod)")]]


class Scheduling(Section, total=False):
    kueue: Required[Annotated[Kueue, Field(description="Kueue admission of the whole job")]]
    volcano: Required[Annotated[Volcano, Field(description="the Volcano scheduler with a PodGroup per job")]]


class EvaluationPromote(Section, total=False):
    mode: Required[Annotated[Literal["off", "pointer", "propose"], Field(description=(
        "off: only record the best step; pointer: copy the best package under modelsStore and point `pointer` at "
        "it; propose: record it as proposed (evals/proposal.json)"))]]
    pointer: Annotated[str, Field(description='the model pointer URI (mode pointer; "" = none)')]
    modelsStore: Annotated[str, Field(description="URI prefix promoted packages are copied under")]


class TrainingEvaluation(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="weights packages while training, an evaluation Job each")]]
    weightsEvery: Required[Annotated[int, Field(ge=0, description="a weights package every N steps (0: off)")]]
    weightsEveryMinutes: Required[Annotated[float, Field(ge=0, description=(
        "a weights package every M minutes of rank 0's clock (0: off)"))]]
    weightsKeep: Required[Annotated[int, Field(ge=1, description="weights packages kept on the pod's volume")]]
    maxConcurrent: Required[Annotated[int, Field(ge=1, le=64, description="evaluation Jobs at once")]]
    tasks: Annotated[dict[str, str], Field(description=(
        "lm-evaluation-harness task files (YAML, JSONL) by file name, mounted at /etc/lmforge/eval-tasks"))]
    maxSequences: Required[Annotated[int, Field(ge=1, description="held-out sequences per data source")]]
    score: Required[Annotated[str, Field(pattern=r"^[^/\s]+/[^/\s]+$", description=(
        'what "best" means: "task/metric" or heldout/loss'))]]
    mode: Required[Annotated[Literal["max", "min"], Field(description="higher (max) or lower (min) score is better")]]
    promote: Required[Annotated[EvaluationPromote, Field(description="what happens to the best package")]]
    image: Annotated[str, Field(description='image of the evaluation Jobs ("" = the trainer image)')]
    gpus: Annotated[int, Field(ge=0, le=8, description="GPUs per evaluation Job (0: CPU)")]
    resources: Required[Annotated[Resources, Field(description="resources of the evaluation container")]]
    activeDeadlineSeconds: Annotated[int, Field(ge=1, description="an evaluation Job's deadline")]
    backoffLimit: Annotated[int, Field(ge=0, description="retries (object store unreachable, pod disrupted)")]
    ttlSecondsAfterFinished: Annotated[int, Field(ge=0, description="finished Jobs are deleted after this long")]
    tmpSizeLimit: Annotated[str, Field(pattern=QUANTITY, description="size limit of the Job's /tmp emptyDir")]
    nodeSelector: Annotated[Labels, Field(description="evaluation pods' nodeSelector")]
    tolerations: Annotated[list[Object], Field(description="evaluation pods' tolerations")]


class Training(PodPlacement, total=False):
    enabled: Required[Annotated[bool, Field(description="run training from the chart")]]
    operator: Required[Annotated[Literal["pytorchjob", "trainjob"], Field(description=(
        "pytorchjob (Training Operator v1: PyTorchJob) | trainjob (Trainer v2: TrainJob + TrainingRuntime)"))]]
    run: Required[Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$", description=(
        "run name (RUN_DIR /checkpoints/<run>, store prefix <objectStore>/<run>)"))]]
    objectStore: Required[Annotated[str, Field(pattern=S3_PREFIX,
                                               description="object-store prefix of runs (s3://BUCKET/PREFIX)")]]
    nodes: Required[Annotated[int, Field(ge=1, le=1024,
                                         description="pods (nodes); PyTorchJob: one Master plus nodes-1 Workers")]]
    nprocPerNode: Required[Annotated[int, Field(ge=1, le=64,
                                                description="processes per pod (GPUs per node, or CPU processes)")]]
    gpusPerProcess: Required[Annotated[int, Field(ge=0, le=1, description="GPUs per process: 0 (CPU) or 1")]]
    gpuResource: Annotated[str, Field(min_length=1, description="extended resource name of a GPU")]
    elastic: Required[Annotated[Elastic, Field(description="elastic rendezvous (elasticPolicy, c10d)")]]
    restartPolicy: Required[Annotated[Literal["OnFailure", "ExitCode", "Never", "Always"],
                                      Field(description="replica restart policy")]]
    backoffLimit: Annotated[int, Field(ge=0, description=(
        "restarts before the job fails (PyTorchJob runPolicy.backoffLimit, TrainJob node Job backoffLimit)"))]
    port: Required[Annotated[Port, Field(
        description="PyTorchJob rendezvous port (container port pytorchjob-port; Trainer v2: 29500)")]]
    metricsPort: Required[Annotated[Port, Field(
        description="the trainer's /metrics port on rank 0 (port name metrics)")]]
    config: Required[Annotated[Object, service_config(
        TrainConfig, "trainer config (nested keys, passed as key=value overrides)")]]
    checkpoints: Required[Annotated[Checkpoints, Field(description="the /checkpoints volume")]]
    dataCacheSizeLimit: Annotated[str, Field(pattern=QUANTITY,
                                             description="size limit of the /cache emptyDir (s3:// data block cache)")]
    shmSize: Annotated[str, Field(pattern=QUANTITY, description="size of the /dev/shm memory emptyDir")]
    tmpSizeLimit: Annotated[str, Field(pattern=QUANTITY, description="size limit of the /tmp emptyDir")]
    resources: Required[Annotated[Resources, Field(
        description="resources of the trainer container (GPUs are added)")]]
    uploader: Required[Annotated[Uploader, Field(description="the restore init container and the uploader sidecar")]]
    scheduling: Required[Annotated[Scheduling, Field(description=(
        "gang scheduling: all of the job's pods start together or none does (Kueue or Volcano, not both)"))]]
    evaluation: Annotated[TrainingEvaluation, Field(description=(
        "evaluation branches: weights packages while training, a Kubernetes Job evaluating each, the best promoted"))]


# -- inference -----------------------------------------------------------------------------------------


class InferenceService(Section, total=False):
    type: Required[Annotated[Literal["ClusterIP", "NodePort", "LoadBalancer"], Field(description="Service type")]]
    annotations: Annotated[Labels, Field(description="Service annotations")]


class MetricSpec(TypedDict, total=False):
    """An autoscaling/v2 MetricSpec, passed on as it is."""

    __pydantic_config__ = ConfigDict(extra="allow")
    type: Required[str]


class Autoscaling(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="autoscale instead of a fixed replica count")]]
    minReplicas: Required[Annotated[int, Field(ge=1, description="fewest replicas")]]
    maxReplicas: Required[Annotated[int, Field(ge=1, description="most replicas")]]
    targetCPUUtilizationPercentage: Annotated[int, Field(
        ge=1, le=100, description="average CPU utilisation target, % of the request")]
    metrics: Annotated[list[MetricSpec], Field(description="autoscaling/v2 MetricSpecs replacing the CPU target")]


class Pdb(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create it")]]
    minAvailable: Required[Annotated[
        Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=r"^[0-9]{1,3}%$")],
        Field(description="replicas kept through voluntary disruptions: an integer or a percentage")]]


class StartupProbe(Section, total=False):
    loadTimeoutSeconds: Required[Annotated[int, Field(
        ge=1, description="time a replica has to load its model before it is restarted")]]
    periodSeconds: Required[Annotated[int, Field(ge=1, description="seconds between probes")]]
    timeoutSeconds: Required[Annotated[int, Field(ge=1, description="seconds one probe may take")]]


class Probe(Section, total=False):
    periodSeconds: Required[Annotated[int, Field(ge=1, description="seconds between probes")]]
    failureThreshold: Required[Annotated[int, Field(ge=1, description="failures before the probe fails")]]


class TopologySpreadConstraint(TypedDict, total=False):
    """A TopologySpreadConstraint, passed on as it is."""

    __pydantic_config__ = ConfigDict(extra="allow")
    topologyKey: Required[str]
    maxSkew: Required[int]
    whenUnsatisfiable: Required[str]


class TopologySpread(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="spread the replicas")]]
    topologyKeys: Required[Annotated[list[Annotated[str, Field(min_length=1)]], Field(
        json_schema_extra={"uniqueItems": True}, description="node labels to spread over, one constraint each")]]
    maxSkew: Required[Annotated[int, Field(
        ge=1, description="largest allowed difference in replicas between two domains")]]
    whenUnsatisfiable: Required[Annotated[Literal["ScheduleAnyway", "DoNotSchedule"], Field(
        description="ScheduleAnyway (prefer) | DoNotSchedule (insist)")]]
    constraints: Required[Annotated[list[TopologySpreadConstraint], Field(
        description="full TopologySpreadConstraints used instead of the generated ones")]]


class Vllm(Section, total=False):
    """`vllm serve` settings (backend vllm); names and defaults as in vLLM's engine arguments
    (https://docs.vllm.ai/en/stable/configuration/engine_args/)."""

    image: Required[Annotated[str, Field(min_length=1, pattern=r"^\S+$", description=(
        "vLLM's OpenAI server image, pinned (the recording rules map its metric names)"))]]
    dtype: Annotated[Literal["auto", "half", "float16", "bfloat16", "float", "float32"],
                     Field(description="--dtype (vLLM's default: auto)")]
    maxModelLen: Annotated[int, Field(ge=0, description="--max-model-len (0 = the model's context length)")]
    gpuMemoryUtilization: Annotated[float, Field(gt=0, le=1, description=(
        "--gpu-memory-utilization, share of GPU memory vLLM may use (vLLM's default: 0.9)"))]
    tensorParallelSize: Annotated[int, Field(ge=1, le=16, description="--tensor-parallel-size (GPUs per replica)")]
    extraArgs: Annotated[list[str], Field(description="more `vllm serve` arguments")]
    shmSizeLimit: Annotated[str, Field(pattern=QUANTITY, description="size of the /dev/shm emptyDir (memory)")]


class Trace(Section, total=False):
    """/v1/trace from the trace index (the server config's trace.* fields; with vLLM a `trace` container)."""

    enabled: Required[Annotated[bool, Field(description="serve /v1/trace (needs index)")]]
    index: Required[Annotated[str, Field(pattern=r"^\S*$", description=(
        "the trace index: a data-prep output's trace-index/ folder (s3://… or a path in the pod)"))]]
    cacheSize: Required[Annotated[str, Field(pattern=QUANTITY, description=(
        "size limit of the trace-cache emptyDir the index is downloaded to"))]]
    maxConcurrent: Required[Annotated[int, Field(ge=1, le=64, description=(
        "trace requests worked on at once per replica (trace.max_concurrent; more get 429)"))]]
    timeoutSeconds: Required[Annotated[float, Field(gt=0, le=600, description=(
        "a trace request's time limit, seconds (trace.timeout_s; then 504)"))]]
    maxTokens: Required[Annotated[int, Field(ge=1, le=1_000_000, description=(
        "the longest text traced, in tokens (trace.max_tokens; longer: 413)"))]]
    tracePort: Annotated[Port, Field(description="backend vllm: the trace service's port (Service port trace)")]
    resources: Annotated[Resources, Field(description="backend vllm: resources of the trace container")]


class Inference(PodPlacement, total=False):
    enabled: Required[Annotated[bool, Field(description="deploy the inference server")]]
    backend: Annotated[Literal["lmforge", "vllm"], Field(description=(
        "the server: lmforge (lmforge-serve) or vllm (vLLM's OpenAI server on the Hugging Face format export)"))]
    vllm: Annotated[Vllm, Field(description="vLLM's settings (backend vllm)")]
    model: Required[Annotated[str, Field(pattern=S3_PREFIX, description=(
        "a model pointer the replicas follow (s3://BUCKET/PREFIX/models/current) or a model package "
        "(s3://BUCKET/PREFIX/models/VERSION)"))]]
    pointerPollSeconds: Annotated[float, Field(gt=0, description="with a model pointer: seconds between reads of it")]
    modelName: Annotated[str, Field(description=(
        'served model name ("" = the last segment of model: the package folder or the pointer\'s name)'))]
    apiDocs: Annotated[bool, Field(description="serve /docs, /redoc and /openapi.json (without authentication)")]
    replicas: Required[Annotated[int, Field(ge=0, description="replicas when autoscaling is off")]]
    port: Required[Annotated[Port, Field(description="API port (Service port http)")]]
    metricsPort: Required[Annotated[Port, Field(description="/metrics port (Service port metrics)")]]
    gpus: Annotated[int, Field(ge=0, le=16, description="GPUs per replica (0: CPU)")]
    gpuResource: Annotated[str, Field(min_length=1, description="extended resource name of a GPU")]
    config: Annotated[Object, service_config(
        ServeConfig, "server config (nested keys, passed as key=value overrides)")]
    apiKeys: Required[Annotated[SecretKey, Field(
        description='API keys: an existing Secret with the keys file ("" = no authentication) and its key')]]
    service: Required[Annotated[InferenceService, Field(description="the Service")]]
    autoscaling: Required[Annotated[Autoscaling, Field(description="the HorizontalPodAutoscaler")]]
    pdb: Required[Annotated[Pdb, Field(description="the PodDisruptionBudget")]]
    tmpSizeLimit: Annotated[str, Field(pattern=QUANTITY,
                                       description="size limit of the /tmp emptyDir (holds the model package)")]
    resources: Required[Annotated[Resources, Field(description="resources of the server")]]
    startupProbe: Annotated[StartupProbe, Field(
        description="the /readyz startup probe: liveness and readiness wait for the model to load")]
    readinessProbe: Annotated[Probe, Field(description="the /readyz probe")]
    livenessProbe: Annotated[Probe, Field(description="the /healthz probe")]
    terminationGracePeriodSeconds: Annotated[int, Field(ge=0, description="time to drain on shutdown")]
    topologySpread: Annotated[TopologySpread, Field(description="topologySpreadConstraints of the replicas")]
    trace: Annotated[Trace, Field(description="/v1/trace: outputs traced to the training documents")]


# -- canary -------------------------------------------------------------------------------------------


class HeldOutText(Section, total=False):
    id: Annotated[str, Field(description="unique id")]
    text: Required[Annotated[str, Field(min_length=1, description="the text")]]


class Check(Section, total=False):
    id: Annotated[str, Field(description="unique id")]
    prompt: Required[Annotated[str, Field(min_length=1, description="the prompt")]]
    expected: Required[Annotated[str, Field(min_length=1,
                                            description="the expected start of the greedy continuation")]]
    max_tokens: Annotated[int, Field(ge=1, description="tokens generated")]
    stop: Annotated[list[str], Field(max_length=4, description="stop strings")]


class EvalSet(Section, total=False):
    """The canary's eval-set file (lmforge.canary.evalset), mounted from a ConfigMap."""

    name: Annotated[str, Field(description="name shown in the table and stored in the baseline")]
    held_out: Required[Annotated[
        list[Annotated[str, Field(min_length=1, description="a text")]
             | Annotated[HeldOutText, Field(description="a text with an id")]],
        Field(min_length=1, description="texts scored for perplexity")]]
    checks: Required[Annotated[list[Annotated[Check, Field(description="a check")]],
                               Field(min_length=1, description="prompt → expected-continuation checks")]]


class Canary(PodPlacement, total=False):
    enabled: Required[Annotated[bool, Field(description="run the daily canary")]]
    schedule: Required[Annotated[str, Field(
        pattern=r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)$",
        description="cron schedule (5 fields, or a macro such as @daily)")]]
    timeZone: Annotated[str, Field(description="IANA time zone of the schedule (\"\" = the controller's)")]
    endpoint: Annotated[str, Field(pattern=HTTP_URL,
                                   description="inference base URL (\"\" = the release's inference Service)")]
    baseline: Annotated[str, Field(pattern=r"^(s3://.+)?$",
                                   description='baseline file (s3://BUCKET/KEY; "" = none: runs pass)')]
    apiKey: Required[Annotated[SecretKey, Field(
        description='the canary\'s API key: the Secret holding it ("" = inference.apiKeys) and its key')]]
    config: Annotated[Object, service_config(
        CanaryConfig, "canary config (nested keys, passed as key=value overrides)")]
    evalSet: Required[Annotated[EvalSet, Field(description="the eval set")]]
    activeDeadlineSeconds: Annotated[int, Field(ge=1, description="a run's deadline")]
    backoffLimit: Annotated[int, Field(ge=0, description="retries (endpoint unreachable)")]
    startingDeadlineSeconds: Annotated[int, Field(
        ge=1, description="a run not started this long after its schedule is skipped")]
    successfulJobsHistoryLimit: Annotated[int, Field(ge=0, description="finished Jobs kept")]
    failedJobsHistoryLimit: Annotated[int, Field(ge=0, description="failed Jobs kept")]
    resources: Required[Annotated[Resources, Field(description="resources of the canary")]]


# -- monitoring and alerts ---------------------------------------------------------------------------


class ServiceMonitors(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create them")]]
    interval: Required[Annotated[Duration, Field(description="scrape interval")]]


class Dashboards(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create them")]]
    labels: Annotated[Labels, Field(description="labels the Grafana sidecar selects on")]
    folder: Annotated[str, Field(description="Grafana folder (annotation grafana_folder)")]


class Monitoring(Section, total=False):
    additionalLabels: Annotated[Labels, Field(
        description="extra labels on ServiceMonitor/PodMonitor/PrometheusRule (e.g. release: kube-prometheus-stack)")]
    rateWindow: Required[Annotated[Duration, Field(description="window of the recording rules' rate()")]]
    runbookBaseUrl: Annotated[str, Field(pattern=HTTP_URL,
                                         description='base URL of docs/operations.md for runbook_url ("" = none)')]
    serviceMonitors: Required[Annotated[ServiceMonitors, Field(description="ServiceMonitor and PodMonitors")]]
    prometheusRule: Required[Annotated[Enabled, Field(description="the PrometheusRule")]]
    rulesConfigMap: Required[Annotated[Enabled, Field(description="the rules as a plain rule file ConfigMap")]]
    dashboards: Required[Annotated[Dashboards, Field(description="Grafana dashboard ConfigMaps")]]


class ForOnly(Section, total=False):
    for_: Required[For]


class LatencyAlert(Section, total=False):
    p95Seconds: Required[Annotated[float, Field(ge=0, description="p95 SLO, seconds")]]
    for_: Required[For]


class ErrorsAlert(Section, total=False):
    ratio: Required[Annotated[float, Field(ge=0, le=1, description="5xx share")]]
    for_: Required[For]


class QueueAlert(Section, total=False):
    waiting: Required[Annotated[float, Field(ge=0, description="requests waiting on one replica")]]
    for_: Required[For]


class PreemptionsAlert(Section, total=False):
    perRequest: Required[Annotated[float, Field(ge=0, description="preemptions per finished request")]]
    for_: Required[For]


class InferenceAlerts(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create these alerts")]]
    ttft: Annotated[LatencyAlert, Field(description="LmforgeInferenceTTFTHigh: p95 time to first token")]
    tpot: Annotated[LatencyAlert, Field(description="LmforgeInferenceTPOTHigh: p95 time per output token")]
    errors: Annotated[ErrorsAlert, Field(description="LmforgeInferenceErrorRateHigh")]
    queue: Annotated[QueueAlert, Field(description="LmforgeInferenceQueueSaturated")]
    noReadyReplicas: Annotated[ForOnly, Field(description="LmforgeInferenceNoReadyReplicas")]
    preemptions: Annotated[PreemptionsAlert, Field(description="LmforgeInferencePreemptionsHigh")]


class CanaryAlerts(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create these alerts")]]
    staleHours: Annotated[float, Field(ge=1, description="hours after which a canary group is stale")]
    regression: Annotated[ForOnly, Field(description="LmforgeCanaryRegression")]
    stale: Annotated[ForOnly, Field(description="LmforgeCanaryStale")]
    memorizedTokenRatio: Annotated[float, Field(ge=0, le=1, description=(
        "LmforgeCanaryMemorization: share of the canary's generated tokens found verbatim in the training data"))]
    memorization: Annotated[ForOnly, Field(description="LmforgeCanaryMemorization")]


class StalledAlert(Section, total=False):
    window: Required[Annotated[Duration, Field(description="window the step must change in")]]
    for_: Required[For]


class LossSpikeAlert(Section, total=False):
    factor: Required[Annotated[float, Field(ge=1, description="loss / its 30-minute average")]]
    for_: Required[For]


class NonFiniteAlert(Section, total=False):
    window: Required[Annotated[Duration, Field(description="window")]]
    maxSteps: Required[Annotated[float, Field(ge=0, description="steps tolerated")]]
    for_: Required[For]


class MfuAlert(Section, total=False):
    floor: Required[Annotated[float, Field(ge=0, le=1, description="MFU floor")]]
    for_: Required[For]


class CheckpointUploadAlerts(Section, total=False):
    stalledAfter: Required[Annotated[Duration, Field(description="pending this long: stalled")]]
    stalledFor: Required[Holds]
    lagSeconds: Required[Annotated[float, Field(ge=0, description="upload lag threshold, seconds")]]
    lagFor: Required[Holds]
    maxFailures: Required[Annotated[float, Field(ge=0, description="failures tolerated in failuresWindow")]]
    failuresWindow: Required[Annotated[Duration, Field(description="window")]]
    failuresFor: Required[Holds]


class TrainingAlerts(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create these alerts")]]
    stalled: Annotated[StalledAlert, Field(description="LmforgeTrainingStalled")]
    lossSpike: Annotated[LossSpikeAlert, Field(description="LmforgeTrainingLossSpike")]
    nonfinite: Annotated[NonFiniteAlert, Field(description="LmforgeTrainingNonFiniteSteps")]
    mfu: Annotated[MfuAlert, Field(description="LmforgeTrainingMFULow")]
    checkpointUpload: Annotated[CheckpointUploadAlerts, Field(description="checkpoint upload alerts")]
    evalScoreDrop: Annotated[float, Field(ge=0, description="LmforgeEvalTaskRegression: a task score below its "
                                          "best so far by more than this (the uploader's records use it too)")]
    evalLossRise: Annotated[float, Field(ge=0, description="LmforgeEvalHeldOutRegression: a held-out loss above "
                                         "its best so far by more than this, in nats")]
    evalFor: Holds


class DropRateAlert(Section, total=False):
    tolerance: Required[Annotated[float, Field(ge=0, le=1, description="absolute drop-ratio deviation")]]
    usualWindow: Required[Annotated[Duration, Field(description="window of the usual ratio")]]
    minDocuments: Required[Annotated[float, Field(ge=0, description="documents a stage must have seen")]]
    for_: Required[For]


class DataprepAlerts(Section, total=False):
    enabled: Required[Annotated[bool, Field(description="create these alerts")]]
    recentHours: Annotated[int, Field(ge=1, description="pushes within this many hours count")]
    workerFailures: Annotated[ForOnly, Field(description="LmforgeDataprepWorkerFailures")]
    dropRate: Annotated[DropRateAlert, Field(description="LmforgeDataprepDropRateAnomalous")]


class Alerts(Section, total=False):
    forOverride: Annotated[str, Field(pattern=f"^$|{DURATION}",
                                      description='a `for:` every alert uses instead of its own ("" = none)')]
    inference: Required[Annotated[InferenceAlerts, Field(description="serving alerts")]]
    canary: Required[Annotated[CanaryAlerts, Field(description="canary alerts")]]
    training: Required[Annotated[TrainingAlerts, Field(description="training and uploader alerts")]]
    dataprep: Required[Annotated[DataprepAlerts, Field(description="data-prep alerts")]]


# -- the chart -------------------------------------------------------------------------------------


class ChartValues(Section, total=False):
    global_: Annotated[Object, Field(alias="global",
                                     description="Helm global values (shared with the dependency charts)")]
    nameOverride: Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description=(
        "the app.kubernetes.io/name label and, with the release name, the object name prefix "
        '("" = lmforge, prefix <release>)'))]
    fullnameOverride: Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description=(
        'the prefix of every object name (<fullnameOverride>-<component>; "" = from the release name and '
        "nameOverride)"))]
    image: Required[Annotated[Image, Field(description="image settings shared by every lmforge image")]]
    images: Required[Annotated[Images, Field(description="repository of each service image")]]
    podSecurityContext: Annotated[PodSecurityContext, Field(
        description="pod securityContext of every pod (runAsNonRoot is always set by the chart)")]
    logLevel: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Field(description="log level of every service")]
    s3: Required[Annotated[S3, Field(description="the object store")]]
    serviceAccount: Required[Annotated[ServiceAccount, Field(description="the workloads' ServiceAccount")]]
    rbac: Required[Annotated[Rbac, Field(description="RBAC objects")]]
    pipelineRunner: Required[Annotated[PipelineRunner, Field(
        description="the identity Kubeflow Pipelines launches runs with")]]
    networkPolicy: Required[Annotated[NetworkPolicy, Field(description="ingress NetworkPolicies")]]
    telemetry: Annotated[Telemetry, Field(
        description='where telemetry goes ("" = the bundled dependency when enabled)')]
    dataprep: Required[Annotated[Dataprep, Field(
        description="data prep as an Indexed Job of workers and a Job per global stage")]]
    training: Required[Annotated[Training, Field(description="one training run as a Kubeflow PyTorchJob or TrainJob")]]
    inference: Required[Annotated[Inference, Field(
        description="the inference Deployment, Service, HPA and PodDisruptionBudget")]]
    canary: Required[Annotated[Canary, Field(description="the canary CronJob")]]
    monitoring: Required[Annotated[Monitoring, Field(description="monitoring objects")]]
    alerts: Required[Annotated[Alerts, Field(description="alert rules (thresholds and for: durations)")]]
    kube_prometheus_stack: Annotated[Dependency, Field(alias="kube-prometheus-stack", description=(
        "kube-prometheus-stack chart values (turn off when the cluster has Prometheus and Grafana)"))]
    prometheus_pushgateway: Annotated[Dependency, Field(alias="prometheus-pushgateway", description=(
        "prometheus-pushgateway chart values (turn off to use an existing Pushgateway: telemetry.pushgateway)"))]
    opentelemetry_collector: Annotated[Dependency, Field(alias="opentelemetry-collector", description=(
        "opentelemetry-collector chart values (turn off to use an existing collector: telemetry.otlpEndpoint)"))]
