"""The mdq services; each subpackage is one process (python -m services.<name>)."""
