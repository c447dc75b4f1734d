"""The demo's stages, one module each; `lmforge.demo.platform` runs them in order."""
