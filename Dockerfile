# respd with the embedded default model; llama-cpp-python compiles from source here.
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir .
EXPOSE 8080
ENTRYPOINT ["respd", "serve", "--host", "0.0.0.0", "--port", "8080"]
