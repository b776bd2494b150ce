#!/bin/sh
# MinIO's one-shot setup, with the root credentials (MC_HOST_local), idempotent: the bucket `tokenmill`, and the
# user tokenmill's processes use (TOKENMILL_S3_ACCESS_KEY / TOKENMILL_S3_SECRET_KEY), allowed that bucket only by
# policy.json beside this file. Only this job and MinIO hold the root credentials.
set -eu
here=$(dirname "$0")
mc mb --ignore-existing local/tokenmill
mc admin policy create local tokenmill-bucket "$here/policy.json"
mc admin user add local "$TOKENMILL_S3_ACCESS_KEY" "$TOKENMILL_S3_SECRET_KEY"
# attach refuses a policy the user already has (a re-run); then the user must show it.
mc admin policy attach local tokenmill-bucket --user "$TOKENMILL_S3_ACCESS_KEY" ||
  mc admin user info local "$TOKENMILL_S3_ACCESS_KEY" | grep -q tokenmill-bucket
