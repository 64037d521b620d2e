"""recovery: decides, per failure class, how a failed attempt is retried or given up."""
