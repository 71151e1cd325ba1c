# torchx's image: the image of KFP steps (torchx_launcher, start/close_pipeline_run), of
# builtin components on Kubernetes and AWS Batch, and of local_docker jobs.
#
#   docker build -t "$(python -c 'import torchx; print(torchx.IMAGE)')" .
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime \
#       --build-arg EXTRAS=kfp,mlflow,kubernetes,examples -t registry.example.com/team/torchx:0.8.0 .
#
# BASE_IMAGE needs Python >= 3.10 with pip. torch is not installed here: build from a PyTorch
# image (or one with torch) for jobs that need it.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# torchx's extras to install (comma-separated): kfp and mlflow serve KFP steps and tracking,
# kubernetes lets a KFP step submit its stage to the cluster
ARG EXTRAS=kfp,mlflow,kubernetes
WORKDIR /opt/torchx
# dependencies first (pinned by constraints.txt), so a change of torchx's code rebuilds one layer
COPY pyproject.toml constraints.txt README.md ./
RUN python -m pip install -q uv \
    && python -m uv pip install -q --python "$(command -v python)" -c constraints.txt \
        -r pyproject.toml $(echo ",${EXTRAS}" | sed 's/,\([^,]\+\)/ --extra \1/g')
COPY torchx torchx
COPY examples examples
RUN python -m uv pip install -q --python "$(command -v python)" --no-deps . \
    && python -c "import torchx.schedulers"
WORKDIR /workspace
