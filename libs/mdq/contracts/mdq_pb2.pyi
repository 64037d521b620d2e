import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    TASK_MD: _ClassVar[Task]
    TASK_MINIMIZE: _ClassVar[Task]
    TASK_ANALYZE: _ClassVar[Task]

class Integrator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTEGRATOR_UNSPECIFIED: _ClassVar[Integrator]
    INTEGRATOR_LANGEVIN_MIDDLE: _ClassVar[Integrator]
    INTEGRATOR_LANGEVIN: _ClassVar[Integrator]
    INTEGRATOR_VERLET: _ClassVar[Integrator]
    INTEGRATOR_NOSE_HOOVER: _ClassVar[Integrator]

class NonbondedMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONBONDED_METHOD_UNSPECIFIED: _ClassVar[NonbondedMethod]
    NONBONDED_PME: _ClassVar[NonbondedMethod]
    NONBONDED_CUTOFF_PERIODIC: _ClassVar[NonbondedMethod]
    NONBONDED_CUTOFF_NON_PERIODIC: _ClassVar[NonbondedMethod]
    NONBONDED_NO_CUTOFF: _ClassVar[NonbondedMethod]

class TrajectoryFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_FORMAT_UNSPECIFIED: _ClassVar[TrajectoryFormat]
    TRAJECTORY_DCD: _ClassVar[TrajectoryFormat]
    TRAJECTORY_XTC: _ClassVar[TrajectoryFormat]

class ControlVerb(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_VERB_UNSPECIFIED: _ClassVar[ControlVerb]
    CONTROL_CANCEL: _ClassVar[ControlVerb]
    CONTROL_HOLD: _ClassVar[ControlVerb]
    CONTROL_RELEASE: _ClassVar[ControlVerb]
    CONTROL_REQUEUE: _ClassVar[ControlVerb]
    CONTROL_REPRIORITIZE: _ClassVar[ControlVerb]
    CONTROL_EXTEND: _ClassVar[ControlVerb]

class ControlResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_RESULT_UNSPECIFIED: _ClassVar[ControlResult]
    CONTROL_DONE: _ClassVar[ControlResult]
    CONTROL_STOPPING: _ClassVar[ControlResult]
    CONTROL_UNCHANGED: _ClassVar[ControlResult]
    CONTROL_NOT_APPLICABLE: _ClassVar[ControlResult]
    CONTROL_NOT_FOUND: _ClassVar[ControlResult]
    CONTROL_FORBIDDEN: _ClassVar[ControlResult]

class FailureReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_REASON_UNSPECIFIED: _ClassVar[FailureReason]
    FAILURE_CRASHED: _ClassVar[FailureReason]
    FAILURE_OOM_KILLED: _ClassVar[FailureReason]
    FAILURE_EVICTED: _ClassVar[FailureReason]
    FAILURE_NODE_LOST: _ClassVar[FailureReason]
    FAILURE_LOST: _ClassVar[FailureReason]
    FAILURE_UNSTABLE: _ClassVar[FailureReason]
    FAILURE_INVALID_INPUT: _ClassVar[FailureReason]
    FAILURE_DEPENDENCY_FAILED: _ClassVar[FailureReason]
    FAILURE_RETRIES_EXHAUSTED: _ClassVar[FailureReason]
    FAILURE_QUARANTINED: _ClassVar[FailureReason]
    FAILURE_ENVIRONMENT: _ClassVar[FailureReason]
    FAILURE_EXPIRED: _ClassVar[FailureReason]
    FAILURE_CLUSTER_LOST: _ClassVar[FailureReason]
    FAILURE_STOPPED: _ClassVar[FailureReason]
    FAILURE_LIMIT_EXCEEDED: _ClassVar[FailureReason]

class PodPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POD_PHASE_UNSPECIFIED: _ClassVar[PodPhase]
    POD_PENDING: _ClassVar[PodPhase]
    POD_RUNNING: _ClassVar[PodPhase]
    POD_SUCCEEDED: _ClassVar[PodPhase]
    POD_FAILED: _ClassVar[PodPhase]
TASK_UNSPECIFIED: Task
TASK_MD: Task
TASK_MINIMIZE: Task
TASK_ANALYZE: Task
INTEGRATOR_UNSPECIFIED: Integrator
INTEGRATOR_LANGEVIN_MIDDLE: Integrator
INTEGRATOR_LANGEVIN: Integrator
INTEGRATOR_VERLET: Integrator
INTEGRATOR_NOSE_HOOVER: Integrator
NONBONDED_METHOD_UNSPECIFIED: NonbondedMethod
NONBONDED_PME: NonbondedMethod
NONBONDED_CUTOFF_PERIODIC: NonbondedMethod
NONBONDED_CUTOFF_NON_PERIODIC: NonbondedMethod
NONBONDED_NO_CUTOFF: NonbondedMethod
TRAJECTORY_FORMAT_UNSPECIFIED: TrajectoryFormat
TRAJECTORY_DCD: TrajectoryFormat
TRAJECTORY_XTC: TrajectoryFormat
CONTROL_VERB_UNSPECIFIED: ControlVerb
CONTROL_CANCEL: ControlVerb
CONTROL_HOLD: ControlVerb
CONTROL_RELEASE: ControlVerb
CONTROL_REQUEUE: ControlVerb
CONTROL_REPRIORITIZE: ControlVerb
CONTROL_EXTEND: ControlVerb
CONTROL_RESULT_UNSPECIFIED: ControlResult
CONTROL_DONE: ControlResult
CONTROL_STOPPING: ControlResult
CONTROL_UNCHANGED: ControlResult
CONTROL_NOT_APPLICABLE: ControlResult
CONTROL_NOT_FOUND: ControlResult
CONTROL_FORBIDDEN: ControlResult
FAILURE_REASON_UNSPECIFIED: FailureReason
FAILURE_CRASHED: FailureReason
FAILURE_OOM_KILLED: FailureReason
FAILURE_EVICTED: FailureReason
FAILURE_NODE_LOST: FailureReason
FAILURE_LOST: FailureReason
FAILURE_UNSTABLE: FailureReason
FAILURE_INVALID_INPUT: FailureReason
FAILURE_DEPENDENCY_FAILED: FailureReason
FAILURE_RETRIES_EXHAUSTED: FailureReason
FAILURE_QUARANTINED: FailureReason
FAILURE_ENVIRONMENT: FailureReason
FAILURE_EXPIRED: FailureReason
FAILURE_CLUSTER_LOST: FailureReason
FAILURE_STOPPED: FailureReason
FAILURE_LIMIT_EXCEEDED: FailureReason
POD_PHASE_UNSPECIFIED: PodPhase
POD_PENDING: PodPhase
POD_RUNNING: PodPhase
POD_SUCCEEDED: PodPhase
POD_FAILED: PodPhase

class SubmitRequest(_message.Message):
    __slots__ = ("idempotency_key", "jobs", "submitted_by")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobSpec]
    submitted_by: str
    def __init__(self, idempotency_key: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobSpec, _Mapping]]] = ..., submitted_by: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("request_id", "job_ids", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    error: SubmitError
    def __init__(self, request_id: _Optional[str] = ..., job_ids: _Optional[_Iterable[str]] = ..., error: _Optional[_Union[SubmitError, _Mapping]] = ...) -> None: ...

class SubmitError(_message.Message):
    __slots__ = ("field", "message")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    field: str
    message: str
    def __init__(self, field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class WaterBox(_message.Message):
    __slots__ = ("box_nm",)
    BOX_NM_FIELD_NUMBER: _ClassVar[int]
    box_nm: float
    def __init__(self, box_nm: _Optional[float] = ...) -> None: ...

class LennardJonesFluid(_message.Message):
    __slots__ = ("atoms", "density_atoms_nm3", "sigma_nm", "epsilon_kj_mol", "mass_dalton", "cutoff_nm")
    ATOMS_FIELD_NUMBER: _ClassVar[int]
    DENSITY_ATOMS_NM3_FIELD_NUMBER: _ClassVar[int]
    SIGMA_NM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_KJ_MOL_FIELD_NUMBER: _ClassVar[int]
    MASS_DALTON_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_NM_FIELD_NUMBER: _ClassVar[int]
    atoms: int
    density_atoms_nm3: float
    sigma_nm: float
    epsilon_kj_mol: float
    mass_dalton: float
    cutoff_nm: float
    def __init__(self, atoms: _Optional[int] = ..., density_atoms_nm3: _Optional[float] = ..., sigma_nm: _Optional[float] = ..., epsilon_kj_mol: _Optional[float] = ..., mass_dalton: _Optional[float] = ..., cutoff_nm: _Optional[float] = ...) -> None: ...

class Structure(_message.Message):
    __slots__ = ("pdb_path", "pdb_content", "force_fields", "padding_nm", "water_model")
    PDB_PATH_FIELD_NUMBER: _ClassVar[int]
    PDB_CONTENT_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELDS_FIELD_NUMBER: _ClassVar[int]
    PADDING_NM_FIELD_NUMBER: _ClassVar[int]
    WATER_MODEL_FIELD_NUMBER: _ClassVar[int]
    pdb_path: str
    pdb_content: str
    force_fields: _containers.RepeatedScalarFieldContainer[str]
    padding_nm: float
    water_model: str
    def __init__(self, pdb_path: _Optional[str] = ..., pdb_content: _Optional[str] = ..., force_fields: _Optional[_Iterable[str]] = ..., padding_nm: _Optional[float] = ..., water_model: _Optional[str] = ...) -> None: ...

class InputFile(_message.Message):
    __slots__ = ("name", "sha256", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class LammpsInput(_message.Message):
    __slots__ = ("script", "variables")
    class VariablesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    script: str
    variables: _containers.ScalarMap[str, str]
    def __init__(self, script: _Optional[str] = ..., variables: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OpenMMSystemXml(_message.Message):
    __slots__ = ("system_xml", "state_xml")
    SYSTEM_XML_FIELD_NUMBER: _ClassVar[int]
    STATE_XML_FIELD_NUMBER: _ClassVar[int]
    system_xml: str
    state_xml: str
    def __init__(self, system_xml: _Optional[str] = ..., state_xml: _Optional[str] = ...) -> None: ...

class System(_message.Message):
    __slots__ = ("water_box", "lennard_jones", "structure", "lammps", "openmm_xml")
    WATER_BOX_FIELD_NUMBER: _ClassVar[int]
    LENNARD_JONES_FIELD_NUMBER: _ClassVar[int]
    STRUCTURE_FIELD_NUMBER: _ClassVar[int]
    LAMMPS_FIELD_NUMBER: _ClassVar[int]
    OPENMM_XML_FIELD_NUMBER: _ClassVar[int]
    water_box: WaterBox
    lennard_jones: LennardJonesFluid
    structure: Structure
    lammps: LammpsInput
    openmm_xml: OpenMMSystemXml
    def __init__(self, water_box: _Optional[_Union[WaterBox, _Mapping]] = ..., lennard_jones: _Optional[_Union[LennardJonesFluid, _Mapping]] = ..., structure: _Optional[_Union[Structure, _Mapping]] = ..., lammps: _Optional[_Union[LammpsInput, _Mapping]] = ..., openmm_xml: _Optional[_Union[OpenMMSystemXml, _Mapping]] = ...) -> None: ...

class Barostat(_message.Message):
    __slots__ = ("pressure_bar", "frequency_steps")
    PRESSURE_BAR_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_STEPS_FIELD_NUMBER: _ClassVar[int]
    pressure_bar: float
    frequency_steps: int
    def __init__(self, pressure_bar: _Optional[float] = ..., frequency_steps: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("cpu", "memory_mb", "auto")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    AUTO_FIELD_NUMBER: _ClassVar[int]
    cpu: float
    memory_mb: int
    auto: bool
    def __init__(self, cpu: _Optional[float] = ..., memory_mb: _Optional[int] = ..., auto: _Optional[bool] = ...) -> None: ...

class ResourceRecommendation(_message.Message):
    __slots__ = ("memory_mb", "cpu", "confidence", "samples", "evidence", "applied")
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    memory_mb: int
    cpu: float
    confidence: str
    samples: int
    evidence: str
    applied: bool
    def __init__(self, memory_mb: _Optional[int] = ..., cpu: _Optional[float] = ..., confidence: _Optional[str] = ..., samples: _Optional[int] = ..., evidence: _Optional[str] = ..., applied: _Optional[bool] = ...) -> None: ...

class Convergence(_message.Message):
    __slots__ = ("tolerance_kj_mol", "reports")
    TOLERANCE_KJ_MOL_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    tolerance_kj_mol: float
    reports: int
    def __init__(self, tolerance_kj_mol: _Optional[float] = ..., reports: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "task", "system", "temperature_k", "timestep_fs", "steps", "report_interval_steps", "checkpoint_interval_steps", "convergence", "resources", "priority_class", "depends_on", "max_retries", "friction_per_ps", "seed", "labels", "integrator", "barostat", "nonbonded_method", "cutoff_nm", "platform", "checkpoint_interval_s", "trajectory_interval_steps", "trajectory_format", "clusters", "max_wall_s", "max_disk_mb", "inputs")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_K_FIELD_NUMBER: _ClassVar[int]
    TIMESTEP_FS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    CONVERGENCE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    FRICTION_PER_PS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INTEGRATOR_FIELD_NUMBER: _ClassVar[int]
    BAROSTAT_FIELD_NUMBER: _ClassVar[int]
    NONBONDED_METHOD_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_NM_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_INTERVAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WALL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_DISK_MB_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    task: Task
    system: System
    temperature_k: float
    timestep_fs: float
    steps: int
    report_interval_steps: int
    checkpoint_interval_steps: int
    convergence: Convergence
    resources: Resources
    priority_class: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    max_retries: int
    friction_per_ps: float
    seed: int
    labels: _containers.ScalarMap[str, str]
    integrator: Integrator
    barostat: Barostat
    nonbonded_method: NonbondedMethod
    cutoff_nm: float
    platform: str
    checkpoint_interval_s: float
    trajectory_interval_steps: int
    trajectory_format: TrajectoryFormat
    clusters: ClusterSelector
    max_wall_s: float
    max_disk_mb: int
    inputs: _containers.RepeatedCompositeFieldContainer[InputFile]
    def __init__(self, name: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., system: _Optional[_Union[System, _Mapping]] = ..., temperature_k: _Optional[float] = ..., timestep_fs: _Optional[float] = ..., steps: _Optional[int] = ..., report_interval_steps: _Optional[int] = ..., checkpoint_interval_steps: _Optional[int] = ..., convergence: _Optional[_Union[Convergence, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., priority_class: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., max_retries: _Optional[int] = ..., friction_per_ps: _Optional[float] = ..., seed: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., integrator: _Optional[_Union[Integrator, str]] = ..., barostat: _Optional[_Union[Barostat, _Mapping]] = ..., nonbonded_method: _Optional[_Union[NonbondedMethod, str]] = ..., cutoff_nm: _Optional[float] = ..., platform: _Optional[str] = ..., checkpoint_interval_s: _Optional[float] = ..., trajectory_interval_steps: _Optional[int] = ..., trajectory_format: _Optional[_Union[TrajectoryFormat, str]] = ..., clusters: _Optional[_Union[ClusterSelector, _Mapping]] = ..., max_wall_s: _Optional[float] = ..., max_disk_mb: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[InputFile, _Mapping]]] = ...) -> None: ...

class ClusterSelector(_message.Message):
    __slots__ = ("require", "prefer")
    class RequireEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PreferEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUIRE_FIELD_NUMBER: _ClassVar[int]
    PREFER_FIELD_NUMBER: _ClassVar[int]
    require: _containers.ScalarMap[str, str]
    prefer: _containers.ScalarMap[str, str]
    def __init__(self, require: _Optional[_Mapping[str, str]] = ..., prefer: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("control_key", "verb", "job_ids", "request_id", "labels", "reason", "requested_by", "priority_class", "extend_steps")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTROL_KEY_FIELD_NUMBER: _ClassVar[int]
    VERB_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_STEPS_FIELD_NUMBER: _ClassVar[int]
    control_key: str
    verb: ControlVerb
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    labels: _containers.ScalarMap[str, str]
    reason: str
    requested_by: str
    priority_class: str
    extend_steps: int
    def __init__(self, control_key: _Optional[str] = ..., verb: _Optional[_Union[ControlVerb, str]] = ..., job_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., reason: _Optional[str] = ..., requested_by: _Optional[str] = ..., priority_class: _Optional[str] = ..., extend_steps: _Optional[int] = ...) -> None: ...

class ControlOutcome(_message.Message):
    __slots__ = ("job_id", "result", "state", "attempt", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    result: ControlResult
    state: str
    attempt: int
    message: str
    def __init__(self, job_id: _Optional[str] = ..., result: _Optional[_Union[ControlResult, str]] = ..., state: _Optional[str] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ControlError(_message.Message):
    __slots__ = ("field", "message")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    field: str
    message: str
    def __init__(self, field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("control_id", "outcomes", "error", "matched", "omitted", "counts")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CONTROL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    OMITTED_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    control_id: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ControlOutcome]
    error: ControlError
    matched: int
    omitted: int
    counts: _containers.ScalarMap[str, int]
    def __init__(self, control_id: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ControlOutcome, _Mapping]]] = ..., error: _Optional[_Union[ControlError, _Mapping]] = ..., matched: _Optional[int] = ..., omitted: _Optional[int] = ..., counts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "job_id", "attempt", "time", "producer", "submitted", "rejected", "released", "bound", "started", "succeeded", "attempt_failed", "requeued", "failed", "progress", "checkpoint", "pod", "outputs", "usage", "copied", "fetched", "cancel_requested", "cancelled", "held", "node_load", "node_summary", "unheld", "requeue_requested", "reprioritized", "extended", "limit_exceeded")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FAILED_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COPIED_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    NODE_LOAD_FIELD_NUMBER: _ClassVar[int]
    NODE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    UNHELD_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    REPRIORITIZED_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_EXCEEDED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    job_id: str
    attempt: int
    time: _timestamp_pb2.Timestamp
    producer: str
    submitted: JobSubmitted
    rejected: JobRejected
    released: JobReleased
    bound: JobBound
    started: JobStarted
    succeeded: JobSucceeded
    attempt_failed: AttemptFailed
    requeued: JobRequeued
    failed: JobFailed
    progress: Progress
    checkpoint: Checkpoint
    pod: PodStatus
    outputs: JobOutputs
    usage: AttemptUsage
    copied: CheckpointCopied
    fetched: CopyFetched
    cancel_requested: CancelRequested
    cancelled: JobCancelled
    held: JobHeld
    node_load: NodeLoad
    node_summary: NodeLoadSummary
    unheld: JobUnheld
    requeue_requested: RequeueRequested
    reprioritized: JobReprioritized
    extended: JobExtended
    limit_exceeded: LimitExceeded
    def __init__(self, event_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., producer: _Optional[str] = ..., submitted: _Optional[_Union[JobSubmitted, _Mapping]] = ..., rejected: _Optional[_Union[JobRejected, _Mapping]] = ..., released: _Optional[_Union[JobReleased, _Mapping]] = ..., bound: _Optional[_Union[JobBound, _Mapping]] = ..., started: _Optional[_Union[JobStarted, _Mapping]] = ..., succeeded: _Optional[_Union[JobSucceeded, _Mapping]] = ..., attempt_failed: _Optional[_Union[AttemptFailed, _Mapping]] = ..., requeued: _Optional[_Union[JobRequeued, _Mapping]] = ..., failed: _Optional[_Union[JobFailed, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., pod: _Optional[_Union[PodStatus, _Mapping]] = ..., outputs: _Optional[_Union[JobOutputs, _Mapping]] = ..., usage: _Optional[_Union[AttemptUsage, _Mapping]] = ..., copied: _Optional[_Union[CheckpointCopied, _Mapping]] = ..., fetched: _Optional[_Union[CopyFetched, _Mapping]] = ..., cancel_requested: _Optional[_Union[CancelRequested, _Mapping]] = ..., cancelled: _Optional[_Union[JobCancelled, _Mapping]] = ..., held: _Optional[_Union[JobHeld, _Mapping]] = ..., node_load: _Optional[_Union[NodeLoad, _Mapping]] = ..., node_summary: _Optional[_Union[NodeLoadSummary, _Mapping]] = ..., unheld: _Optional[_Union[JobUnheld, _Mapping]] = ..., requeue_requested: _Optional[_Union[RequeueRequested, _Mapping]] = ..., reprioritized: _Optional[_Union[JobReprioritized, _Mapping]] = ..., extended: _Optional[_Union[JobExtended, _Mapping]] = ..., limit_exceeded: _Optional[_Union[LimitExceeded, _Mapping]] = ...) -> None: ...

class JobSubmitted(_message.Message):
    __slots__ = ("spec", "request_id", "idempotency_key", "depends_on_ids", "submitted_by", "recommended")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_IDS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    request_id: str
    idempotency_key: str
    depends_on_ids: _containers.RepeatedScalarFieldContainer[str]
    submitted_by: str
    recommended: ResourceRecommendation
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., depends_on_ids: _Optional[_Iterable[str]] = ..., submitted_by: _Optional[str] = ..., recommended: _Optional[_Union[ResourceRecommendation, _Mapping]] = ...) -> None: ...

class JobRejected(_message.Message):
    __slots__ = ("request_id", "idempotency_key", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    idempotency_key: str
    error: SubmitError
    def __init__(self, request_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., error: _Optional[_Union[SubmitError, _Mapping]] = ...) -> None: ...

class JobReleased(_message.Message):
    __slots__ = ("depends_on_ids",)
    DEPENDS_ON_IDS_FIELD_NUMBER: _ClassVar[int]
    depends_on_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, depends_on_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeScore(_message.Message):
    __slots__ = ("node", "score", "filtered", "cpu_load", "memory_load")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    CPU_LOAD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LOAD_FIELD_NUMBER: _ClassVar[int]
    node: str
    score: float
    filtered: str
    cpu_load: float
    memory_load: float
    def __init__(self, node: _Optional[str] = ..., score: _Optional[float] = ..., filtered: _Optional[str] = ..., cpu_load: _Optional[float] = ..., memory_load: _Optional[float] = ...) -> None: ...

class JobBound(_message.Message):
    __slots__ = ("node", "pod_name", "candidates", "resources", "resume_from", "nodes_total", "filtered_counts", "not_examined", "cluster", "clusters")
    class FilteredCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    NODES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FILTERED_COUNTS_FIELD_NUMBER: _ClassVar[int]
    NOT_EXAMINED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    node: str
    pod_name: str
    candidates: _containers.RepeatedCompositeFieldContainer[NodeScore]
    resources: Resources
    resume_from: Checkpoint
    nodes_total: int
    filtered_counts: _containers.ScalarMap[str, int]
    not_examined: int
    cluster: str
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterScore]
    def __init__(self, node: _Optional[str] = ..., pod_name: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[NodeScore, _Mapping]]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., resume_from: _Optional[_Union[Checkpoint, _Mapping]] = ..., nodes_total: _Optional[int] = ..., filtered_counts: _Optional[_Mapping[str, int]] = ..., not_examined: _Optional[int] = ..., cluster: _Optional[str] = ..., clusters: _Optional[_Iterable[_Union[ClusterScore, _Mapping]]] = ...) -> None: ...

class ClusterScore(_message.Message):
    __slots__ = ("cluster", "best_score", "best_node", "candidates", "filtered_counts", "cpu_reserved")
    class FilteredCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORE_FIELD_NUMBER: _ClassVar[int]
    BEST_NODE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FILTERED_COUNTS_FIELD_NUMBER: _ClassVar[int]
    CPU_RESERVED_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    best_score: float
    best_node: str
    candidates: int
    filtered_counts: _containers.ScalarMap[str, int]
    cpu_reserved: float
    def __init__(self, cluster: _Optional[str] = ..., best_score: _Optional[float] = ..., best_node: _Optional[str] = ..., candidates: _Optional[int] = ..., filtered_counts: _Optional[_Mapping[str, int]] = ..., cpu_reserved: _Optional[float] = ...) -> None: ...

class JobWaiting(_message.Message):
    __slots__ = ("attempt", "at", "candidates", "nodes_total", "filtered_counts", "summary", "cordons", "clusters")
    class FilteredCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    NODES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FILTERED_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CORDONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    at: _timestamp_pb2.Timestamp
    candidates: _containers.RepeatedCompositeFieldContainer[NodeScore]
    nodes_total: int
    filtered_counts: _containers.ScalarMap[str, int]
    summary: str
    cordons: _containers.RepeatedCompositeFieldContainer[FailureCordon]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterScore]
    def __init__(self, attempt: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[NodeScore, _Mapping]]] = ..., nodes_total: _Optional[int] = ..., filtered_counts: _Optional[_Mapping[str, int]] = ..., summary: _Optional[str] = ..., cordons: _Optional[_Iterable[_Union[FailureCordon, _Mapping]]] = ..., clusters: _Optional[_Iterable[_Union[ClusterScore, _Mapping]]] = ...) -> None: ...

class FailureCordon(_message.Message):
    __slots__ = ("node", "until", "failures")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    node: str
    until: _timestamp_pb2.Timestamp
    failures: int
    def __init__(self, node: _Optional[str] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failures: _Optional[int] = ...) -> None: ...

class ControlOrigin(_message.Message):
    __slots__ = ("control_id", "requested_by", "tenant", "reason")
    CONTROL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    control_id: str
    requested_by: str
    tenant: str
    reason: str
    def __init__(self, control_id: _Optional[str] = ..., requested_by: _Optional[str] = ..., tenant: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRequested(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ...) -> None: ...

class JobCancelled(_message.Message):
    __slots__ = ("origin", "dependency", "message")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    dependency: str
    message: str
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ..., dependency: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class JobHeld(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ...) -> None: ...

class JobUnheld(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ...) -> None: ...

class RequeueRequested(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ...) -> None: ...

class JobReprioritized(_message.Message):
    __slots__ = ("origin", "priority_class", "previous")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    priority_class: str
    previous: str
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ..., priority_class: _Optional[str] = ..., previous: _Optional[str] = ...) -> None: ...

class JobExtended(_message.Message):
    __slots__ = ("origin", "added_steps", "spec", "resume_from", "request_id", "depends_on_ids", "submitted_at", "resources")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ADDED_STEPS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_IDS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    origin: ControlOrigin
    added_steps: int
    spec: JobSpec
    resume_from: Checkpoint
    request_id: str
    depends_on_ids: _containers.RepeatedScalarFieldContainer[str]
    submitted_at: _timestamp_pb2.Timestamp
    resources: Resources
    def __init__(self, origin: _Optional[_Union[ControlOrigin, _Mapping]] = ..., added_steps: _Optional[int] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., resume_from: _Optional[_Union[Checkpoint, _Mapping]] = ..., request_id: _Optional[str] = ..., depends_on_ids: _Optional[_Iterable[str]] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ...) -> None: ...

class LimitExceeded(_message.Message):
    __slots__ = ("limit", "limit_value", "used", "message")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_VALUE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    limit: str
    limit_value: float
    used: float
    message: str
    def __init__(self, limit: _Optional[str] = ..., limit_value: _Optional[float] = ..., used: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class JobStarted(_message.Message):
    __slots__ = ("node", "pod_name")
    NODE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    node: str
    pod_name: str
    def __init__(self, node: _Optional[str] = ..., pod_name: _Optional[str] = ...) -> None: ...

class JobSucceeded(_message.Message):
    __slots__ = ("final_step", "reason", "output_dir")
    FINAL_STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    final_step: int
    reason: str
    output_dir: str
    def __init__(self, final_step: _Optional[int] = ..., reason: _Optional[str] = ..., output_dir: _Optional[str] = ...) -> None: ...

class AttemptFailed(_message.Message):
    __slots__ = ("reason", "exit_code", "message", "node", "last_step")
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    reason: FailureReason
    exit_code: int
    message: str
    node: str
    last_step: int
    def __init__(self, reason: _Optional[_Union[FailureReason, str]] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., node: _Optional[str] = ..., last_step: _Optional[int] = ...) -> None: ...

class JobRequeued(_message.Message):
    __slots__ = ("resume_from", "resources", "avoid_nodes", "not_before", "after", "steps_lost", "copy_lag_steps")
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODES_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    STEPS_LOST_FIELD_NUMBER: _ClassVar[int]
    COPY_LAG_STEPS_FIELD_NUMBER: _ClassVar[int]
    resume_from: Checkpoint
    resources: Resources
    avoid_nodes: _containers.RepeatedScalarFieldContainer[str]
    not_before: _timestamp_pb2.Timestamp
    after: FailureReason
    steps_lost: int
    copy_lag_steps: int
    def __init__(self, resume_from: _Optional[_Union[Checkpoint, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., avoid_nodes: _Optional[_Iterable[str]] = ..., not_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., after: _Optional[_Union[FailureReason, str]] = ..., steps_lost: _Optional[int] = ..., copy_lag_steps: _Optional[int] = ...) -> None: ...

class JobFailed(_message.Message):
    __slots__ = ("reason", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: FailureReason
    message: str
    def __init__(self, reason: _Optional[_Union[FailureReason, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "target_steps", "time_ps", "potential_kj_mol", "kinetic_kj_mol", "temperature_k", "ns_per_day", "eta_s", "done_reason", "volume_nm3", "density_g_cm3", "total_kj_mol", "pressure_bar", "units")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TARGET_STEPS_FIELD_NUMBER: _ClassVar[int]
    TIME_PS_FIELD_NUMBER: _ClassVar[int]
    POTENTIAL_KJ_MOL_FIELD_NUMBER: _ClassVar[int]
    KINETIC_KJ_MOL_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_K_FIELD_NUMBER: _ClassVar[int]
    NS_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    DONE_REASON_FIELD_NUMBER: _ClassVar[int]
    VOLUME_NM3_FIELD_NUMBER: _ClassVar[int]
    DENSITY_G_CM3_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KJ_MOL_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_BAR_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    step: int
    target_steps: int
    time_ps: float
    potential_kj_mol: float
    kinetic_kj_mol: float
    temperature_k: float
    ns_per_day: float
    eta_s: float
    done_reason: str
    volume_nm3: float
    density_g_cm3: float
    total_kj_mol: float
    pressure_bar: float
    units: str
    def __init__(self, step: _Optional[int] = ..., target_steps: _Optional[int] = ..., time_ps: _Optional[float] = ..., potential_kj_mol: _Optional[float] = ..., kinetic_kj_mol: _Optional[float] = ..., temperature_k: _Optional[float] = ..., ns_per_day: _Optional[float] = ..., eta_s: _Optional[float] = ..., done_reason: _Optional[str] = ..., volume_nm3: _Optional[float] = ..., density_g_cm3: _Optional[float] = ..., total_kj_mol: _Optional[float] = ..., pressure_bar: _Optional[float] = ..., units: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("step", "path", "sha256", "size_bytes", "time_ps", "native_path", "native_sha256", "platform", "copy_slot")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_PS_FIELD_NUMBER: _ClassVar[int]
    NATIVE_PATH_FIELD_NUMBER: _ClassVar[int]
    NATIVE_SHA256_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    COPY_SLOT_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    sha256: str
    size_bytes: int
    time_ps: float
    native_path: str
    native_sha256: str
    platform: str
    copy_slot: str
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., time_ps: _Optional[float] = ..., native_path: _Optional[str] = ..., native_sha256: _Optional[str] = ..., platform: _Optional[str] = ..., copy_slot: _Optional[str] = ...) -> None: ...

class CopyManifest(_message.Message):
    __slots__ = ("job_id", "attempt", "slot", "checkpoint", "files", "copied_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    COPIED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    slot: str
    checkpoint: Checkpoint
    files: _containers.RepeatedCompositeFieldContainer[CopiedFile]
    copied_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., slot: _Optional[str] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., files: _Optional[_Iterable[_Union[CopiedFile, _Mapping]]] = ..., copied_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CopiedFile(_message.Message):
    __slots__ = ("name", "sha256", "size_bytes", "chunks", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    size_bytes: int
    chunks: int
    kind: str
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., kind: _Optional[str] = ...) -> None: ...

class CheckpointCopied(_message.Message):
    __slots__ = ("checkpoint", "copy_lag_s", "bytes")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    COPY_LAG_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    copy_lag_s: float
    bytes: int
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., copy_lag_s: _Optional[float] = ..., bytes: _Optional[int] = ...) -> None: ...

class CopyFetched(_message.Message):
    __slots__ = ("checkpoint", "bytes", "fetch_s")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    bytes: int
    fetch_s: float
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., bytes: _Optional[int] = ..., fetch_s: _Optional[float] = ...) -> None: ...

class OutputFile(_message.Message):
    __slots__ = ("kind", "path", "sha256", "size_bytes", "format", "frames")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    path: str
    sha256: str
    size_bytes: int
    format: str
    frames: int
    def __init__(self, kind: _Optional[str] = ..., path: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., format: _Optional[str] = ..., frames: _Optional[int] = ...) -> None: ...

class JobOutputs(_message.Message):
    __slots__ = ("final_step", "output_dir", "files")
    FINAL_STEP_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    final_step: int
    output_dir: str
    files: _containers.RepeatedCompositeFieldContainer[OutputFile]
    def __init__(self, final_step: _Optional[int] = ..., output_dir: _Optional[str] = ..., files: _Optional[_Iterable[_Union[OutputFile, _Mapping]]] = ...) -> None: ...

class AttemptUsage(_message.Message):
    __slots__ = ("peak_memory_mb", "cpu_seconds", "wall_seconds", "mean_cores", "ns_per_day", "source", "memory_limit_mb", "cpu_limit", "exit_code", "steps")
    PEAK_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_CORES_FIELD_NUMBER: _ClassVar[int]
    NS_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_MB_FIELD_NUMBER: _ClassVar[int]
    CPU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    peak_memory_mb: float
    cpu_seconds: float
    wall_seconds: float
    mean_cores: float
    ns_per_day: float
    source: str
    memory_limit_mb: int
    cpu_limit: float
    exit_code: int
    steps: int
    def __init__(self, peak_memory_mb: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., wall_seconds: _Optional[float] = ..., mean_cores: _Optional[float] = ..., ns_per_day: _Optional[float] = ..., source: _Optional[str] = ..., memory_limit_mb: _Optional[int] = ..., cpu_limit: _Optional[float] = ..., exit_code: _Optional[int] = ..., steps: _Optional[int] = ...) -> None: ...

class PodStatus(_message.Message):
    __slots__ = ("pod_name", "node", "phase", "exit_code", "reason", "message")
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    pod_name: str
    node: str
    phase: PodPhase
    exit_code: int
    reason: str
    message: str
    def __init__(self, pod_name: _Optional[str] = ..., node: _Optional[str] = ..., phase: _Optional[_Union[PodPhase, str]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("node", "cpu_load", "memory_load", "cpu_capacity", "memory_capacity_mb", "ready", "cordoned", "cluster", "cluster_labels", "problem")
    class ClusterLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    CPU_LOAD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LOAD_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_MB_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LABELS_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    node: str
    cpu_load: float
    memory_load: float
    cpu_capacity: float
    memory_capacity_mb: int
    ready: bool
    cordoned: bool
    cluster: str
    cluster_labels: _containers.ScalarMap[str, str]
    problem: str
    def __init__(self, node: _Optional[str] = ..., cpu_load: _Optional[float] = ..., memory_load: _Optional[float] = ..., cpu_capacity: _Optional[float] = ..., memory_capacity_mb: _Optional[int] = ..., ready: _Optional[bool] = ..., cordoned: _Optional[bool] = ..., cluster: _Optional[str] = ..., cluster_labels: _Optional[_Mapping[str, str]] = ..., problem: _Optional[str] = ...) -> None: ...

class NodeLoadSummary(_message.Message):
    __slots__ = ("node", "cluster", "start", "end", "samples", "cpu_load_mean", "cpu_load_max", "memory_load_mean", "memory_load_max")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CPU_LOAD_MEAN_FIELD_NUMBER: _ClassVar[int]
    CPU_LOAD_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LOAD_MEAN_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LOAD_MAX_FIELD_NUMBER: _ClassVar[int]
    node: str
    cluster: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    samples: int
    cpu_load_mean: float
    cpu_load_max: float
    memory_load_mean: float
    memory_load_max: float
    def __init__(self, node: _Optional[str] = ..., cluster: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., samples: _Optional[int] = ..., cpu_load_mean: _Optional[float] = ..., cpu_load_max: _Optional[float] = ..., memory_load_mean: _Optional[float] = ..., memory_load_max: _Optional[float] = ...) -> None: ...
