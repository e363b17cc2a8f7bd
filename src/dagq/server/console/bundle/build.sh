#!/usr/bin/env bash
# Rebuilds the console's vendored JavaScript from npm packages pinned in package-lock.json:
#   ../vendor/dagre.js   — @dagrejs/dagre (layered graph layout) as one ES module;
#   ../vendor/swagger-ui — swagger-ui-dist's bundle and stylesheet, for /docs.
# Only needed when a pinned version changes: the output is committed, so installing or
# running dagq never needs Node. Needs node and npm (the npm registry) to run.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
mkdir -p ../vendor
node_modules/.bin/esbuild entry.js --bundle --format=esm --minify --legal-comments=eof \
    --target=es2020 --outfile=../vendor/dagre.js
cp node_modules/@dagrejs/dagre/LICENSE ../vendor/dagre.LICENSE
mkdir -p ../vendor/swagger-ui
cp node_modules/swagger-ui-dist/{swagger-ui-bundle.js,swagger-ui.css,LICENSE} ../vendor/swagger-ui/
echo "built ../vendor/dagre.js ($(wc -c <../vendor/dagre.js) bytes)"
