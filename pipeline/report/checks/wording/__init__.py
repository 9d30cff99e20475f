"""What the checks say: each check's summary, evidence text and fix, one module per check, kept
apart from the judgement (pipeline/report/checks/<check>.py) so a message can be reworded without
reading, or risking, the statistics."""
