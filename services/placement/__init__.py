"""placement: binds pending jobs to nodes by live load, requests and priority; releases chains."""
