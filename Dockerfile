# watchd container image: multi-stage, slim, non-root, no build tools in the final stage.
# Dependencies install from requirements.lock, pinned with hashes (`make lock` refreshes
# it), so two builds a month apart get the same bytes.
#   docker build -t watchd --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#   docker run --rm -v ./watchd.yaml:/etc/watchd/watchd.yaml:ro -v ./secrets:/run/secrets:ro watchd
# Config and secrets come by mount; state goes to the /var/lib/watchd volume.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG REVISION=unknown
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/watchd \
 && /opt/watchd/bin/pip install --no-compile --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY watchd ./watchd
RUN echo "${REVISION}" > watchd/REVISION \
 && /opt/watchd/bin/pip install --no-compile --no-deps . \
 && /opt/watchd/bin/python -m compileall -q /opt/watchd/lib

FROM python:3.11-slim-bookworm
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="watchd" \
      org.opencontainers.image.description="Monitoring daemon for Coder Agents chats" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.created="${CREATED}"
ENV PATH=/opt/watchd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    WATCHD_CONFIG=/etc/watchd/watchd.yaml \
    STATE_DIRECTORY=/var/lib/watchd
COPY --from=build /opt/watchd /opt/watchd
# A fixed numeric uid/gid so Kubernetes runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 watchd \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/watchd --shell /usr/sbin/nologin watchd \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/watchd \
 && install -d -m 0755 /etc/watchd
USER 10001:10001
VOLUME ["/var/lib/watchd"]
EXPOSE 9310
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9310/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["watchd"]
CMD ["run"]
