"""Who may do what on the bus, in one place: the deployment's trust chain and the credentials it
mints and revokes (``auth``), each identity's publish and subscribe rights (``permissions``),
the runner's short-lived, job-scoped credentials and their renewal (``runner_creds``), and the
JWT claims they carry (``claims``). docs/security.md says what each identity may touch."""
