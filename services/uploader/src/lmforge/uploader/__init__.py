"""lmforge checkpoint-uploader sidecar."""
