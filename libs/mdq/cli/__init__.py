"""The ``mdq`` command line: run the stack, submit jobs, follow them, read the history."""
