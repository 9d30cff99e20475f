"""The team stack (`./dev team up|down|status`): PostgreSQL, an MLflow server on it and a DVC
remote, under one folder, for a team's trial on one machine (docs/team.md)."""
