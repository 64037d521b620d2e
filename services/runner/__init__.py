"""The MD runner: the workload inside each job's pod (``python -m services.runner``).

One process runs one attempt of one job, described by its environment
(:class:`mdq.core.runner_task.RunnerTask`): it fetches the job's input files, steps the job's
engine (OpenMM or LAMMPS), and reports progress, checkpoints and outputs as events and its
outcome as an exit code (:class:`mdq.core.exit_codes.RunnerExit`). Design, and what each module
does: docs/engines.md, "The runner".
"""
