# Ordo as a container; docker-compose.yml pairs it with Apache Kafka.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what `pip install .` needs (no .venv, data or test output from the build context).
COPY pyproject.toml README.md ./
COPY ordo ordo
COPY broker broker
COPY log log
COPY sequencer sequencer
COPY scheduler scheduler
COPY storage storage
COPY recovery recovery
COPY procedures procedures
COPY spark_jobs spark_jobs
RUN pip install . && rm -rf /src

# Run unprivileged; /data and the log secret's folder are created here so fresh named
# volumes inherit this ownership.
RUN useradd --create-home --uid 1000 ordo && mkdir /data && chown ordo /data \
    && mkdir -p /home/ordo/.config/ordo && chown -R ordo /home/ordo/.config && chmod 700 /home/ordo/.config/ordo
USER ordo
WORKDIR /data
VOLUME ["/data"]

ENTRYPOINT ["ordo"]
CMD ["--help"]
