# syntax=docker/dockerfile:1
#
# tokenfair's container images, built from this source tree.
#
#   docker build -t tokenfair:0.1.0 .                     # gateway / server image (default target)
#   docker build --build-arg EXTRAS=server,redis,model -t tokenfair-model:0.1.0 .
#   docker build --target vllm -t tokenfair-vllm:0.1.0 .  # vLLM 0.34 with the scheduler plugin
#
# The default image runs `tokenfair gateway --config /etc/tokenfair/gateway/gateway.yaml`;
# any other sub-command replaces the CMD (`docker run tokenfair:0.1.0 serve --model sim:a10g-llama-7b
# --host 0.0.0.0`). deploy/ holds the Kubernetes manifests that run these images.

# ---------------------------------------------------------------------------------------
# builder: the tokenfair wheel and every wheel it needs for EXTRAS, resolved once here so
# that the runtime stage installs from local files only.
FROM python:3.11-slim AS builder

# The extras installed in the runtime image. `model` (torch + transformers, for
# `tokenfair serve --model <transformers directory>`) pins torch==2.13.0: from PyPI that is
# the CUDA build, several GB. For the CPU build pass
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (its 2.13.0+cpu satisfies
# the pin and is preferred over PyPI's 2.13.0).
ARG EXTRAS=server,redis
ARG TORCH_INDEX_URL=""

WORKDIR /src
# Only what the build reads (pyproject.toml names README.md as the long description).
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[${EXTRAS}]" \
    && mkdir /dist \
    && cp /wheels/tokenfair-*.whl /dist/ \
    && printf 'tokenfair[vllm] @ file://%s\n' /dist/tokenfair-*.whl > /dist/vllm-requirements.txt

# ---------------------------------------------------------------------------------------
# vllm: vLLM's OpenAI server image with tokenfair's scheduler plugin installed next to vLLM
# (core only, never the model extra: vLLM pins its own transformers). The plugin was tested
# with vLLM 0.32 to 0.34; at import it checks that vLLM's scheduler has what it uses, and
# a newer minor that has it runs with one warning (docs/vllm.md, "Supported versions").
FROM vllm/vllm-openai:v0.34.0 AS vllm

# The builder's requirements file names the wheel with the [vllm] extra, which makes pip
# check that the vLLM already in the image is 0.32 or newer (it keeps that vLLM rather
# than installing another).
RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    python3 -m pip install --no-cache-dir --requirement /dist/vllm-requirements.txt \
    && groupadd --gid 10001 tokenfair \
    && useradd --no-log-init --create-home --uid 10001 --gid 10001 tokenfair

# Model weights, compile caches and Hugging Face downloads go under the home directory;
# deploy/ mounts a volume on /home/tokenfair/.cache.
USER 10001:10001
WORKDIR /home/tokenfair
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]

# ---------------------------------------------------------------------------------------
# runtime: the gateway (and `tokenfair serve`); the last stage, so the default target.
FROM python:3.11-slim AS runtime

# MPLCONFIGDIR: the report commands (`tokenfair demo`, `experiment`) draw with matplotlib,
# which wants a writable config folder; under /tmp the image also runs them with a
# read-only root filesystem (deploy/ mounts an emptyDir there).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    HEALTHCHECK_PORT=8080

# The wheels are bind-mounted from the builder for the install alone, so none of them stays
# in a layer. A fixed numeric UID lets Kubernetes' runAsNonRoot check it and lets
# deploy/'s securityContext name the same user.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && groupadd --gid 10001 tokenfair \
    && useradd --no-log-init --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin tokenfair

USER 10001:10001
WORKDIR /home/tokenfair

# 8080: the gateway's API port; 9100: its metrics port (/metrics, /health and the state
# pages without a key: keep it where only monitoring reaches). Both as in deploy/'s
# gateway.yaml. `tokenfair serve` listens on 8000 unless --port says otherwise: set
# HEALTHCHECK_PORT to the port it listens on so that the health check follows it.
EXPOSE 8080 9100

# /health answers 200 on the gateway while some upstream is in rotation (503 when none
# is), and on `tokenfair serve` while its engine runs. The image has no curl: Python's
# urllib asks, and any error (refused, 503, timeout) is exit 1, "unhealthy".
# Kubernetes ignores HEALTHCHECK and uses deploy/'s probes instead.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('HEALTHCHECK_PORT', '8080'), timeout=4)\nexcept Exception as error:\n    sys.exit('unhealthy: %s' % error)"]

ENTRYPOINT ["tokenfair"]
CMD ["gateway", "--config", "/etc/tokenfair/gateway/gateway.yaml"]
