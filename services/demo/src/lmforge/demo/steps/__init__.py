"""The demo's steps, one module each; `lmforge.demo.platform` runs them in order."""
