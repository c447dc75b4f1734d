"""lmforge trace: which training documents contain a span of a text verbatim (an exact-match index over
the training tokens, built by data prep, queried by the server, the canary and the contamination report)."""
