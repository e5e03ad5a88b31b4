# The image docker-compose.yml runs: every llmgw process, one command each.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY llmgw_site llmgw_site
COPY llmgw_cli llmgw_cli
COPY core core
COPY audit audit
COPY catalog catalog
COPY fleet fleet
COPY placement placement
COPY router router
COPY agent_worker agent_worker
COPY protocol protocol
COPY templates templates
COPY static static
COPY manage.py ./
# Static files are served by daphne itself (LLMGW_SERVE_STATIC), so no collectstatic.
RUN pip install --no-cache-dir --require-hashes -r fleet/ctl/requirements.lock \
    && pip install --no-cache-dir --no-deps --no-build-isolation .
ENV LLMGW_HOME=/var/lib/llmgw
