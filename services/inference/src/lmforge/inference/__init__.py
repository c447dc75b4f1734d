"""lmforge inference service."""
