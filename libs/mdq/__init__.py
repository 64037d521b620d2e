"""mdq: load-aware scheduling, live monitoring and recovery of molecular-dynamics jobs."""
