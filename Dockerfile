# kvgate's container image: the CLI with its TypeScript sources, run by tsx (a runtime dependency,
# so `npm ci --omit=dev` keeps it). Used by deploy/ for `kvgate epp`; any other command works too.
#
#   docker build -t <registry>/kvgate:0.1.0 .
FROM node:20-slim

WORKDIR /app
COPY package.json package-lock.json ./
# zeromq ships prebuilt linux x64/arm64 binaries, so no compiler is needed.
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY tsconfig.json ./
COPY bin ./bin
COPY src ./src
COPY config ./config
COPY profiles ./profiles

ENV NODE_ENV=production
# The image's unprivileged `node` user (uid 1000), which deploy/base runs as.
USER node
ENTRYPOINT ["node", "/app/bin/kvgate"]
CMD ["--help"]
