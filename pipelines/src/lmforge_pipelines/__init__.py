"""lmforge's Kubeflow Pipelines (kfp v2 SDK): the data and train pipelines, their components, the
training launchers (PyTorchJob v1, local torchrun) and the inference rollout.

    python -m lmforge_pipelines.compile --output build/pipelines   # data.yaml, train.yaml for the KFP UI
"""
