"""The MD runner: the workload inside each job's pod (``python -m services.runner``).

One process runs one attempt of one job, described by its environment
(:class:`mdq.core.runner_task.RunnerTask`). It fetches the job's own input files, opens the
job's engine (OpenMM or LAMMPS, by its system: docs/engines.md), integrates (or minimises, or
analyses its dependencies' outputs), and tells the rest of mdq what happens, the same whatever
the engine:

* a ``progress`` event every ``report_interval_steps`` (step, energies, temperature, ns/day,
  ETA), the last one with a ``done_reason``; each also becomes a row of ``energies.csv``;
* a ``checkpoint`` event for every checkpoint, published only after the file is renamed into
  place and its sha256 read back from disk, so an announced checkpoint is always whole;
* its exit code (:class:`mdq.core.exit_codes.RunnerExit`), from which recovery classifies a
  failure: PREEMPTED after SIGTERM (with a fresh checkpoint), UNSTABLE on NaN or exploding
  energy, OUT_OF_MEMORY, INVALID_INPUT, CRASHED for anything else.

Engines step synchronously, so every chunk of steps runs in a worker thread while the event
loop keeps publishing; publishes are concurrent and only awaited at checkpoints and before exit.

Modules: ``app`` (entry point, signals, exit codes), ``md`` (the engine-neutral MD and
minimisation loops), ``engines`` (the engine port and its adapters), ``inputs`` (the job's input
files), ``system``, ``recipes`` and ``trajectory`` (the OpenMM engine's system, states and
trajectory), ``checkpoints`` (atomic, verified checkpoint files), ``energies`` (the energy
table), ``samples`` (what every engine reports), ``analysis`` (the analyze task), ``outbox``
(concurrent publishing), ``metrics`` (Prometheus), ``paths``, ``settings``, ``errors``.
"""
