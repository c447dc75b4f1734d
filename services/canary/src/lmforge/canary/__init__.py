"""lmforge canary: the daily evaluation of the deployed model against a recorded baseline."""
