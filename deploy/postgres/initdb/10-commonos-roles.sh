#!/bin/sh
# Run once by the postgres image on a new data directory (/docker-entrypoint-initdb.d): the CommonOS roles of
# bootstrap.sql (mounted at /commonos, or COMMONOS_SQL_DIR) with their passwords from the environment.
# roles.sql is applied later, once the services have created their tables (the `db-roles` job of compose.yaml).
set -eu
: "${PG_JOURNAL_WRITER_PASSWORD:?}" "${PG_BILLING_PASSWORD:?}" "${PG_LOOP_PASSWORD:?}" "${PG_CONSOLE_PASSWORD:?}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "${COMMONOS_SQL_DIR:-/commonos}/bootstrap.sql"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v journal_writer="$PG_JOURNAL_WRITER_PASSWORD" -v billing="$PG_BILLING_PASSWORD" -v loop="$PG_LOOP_PASSWORD" \
    -v console="$PG_CONSOLE_PASSWORD" <<'SQL'
ALTER ROLE cos_journal_writer PASSWORD :'journal_writer';
ALTER ROLE cos_billing PASSWORD :'billing';
ALTER ROLE cos_loop PASSWORD :'loop';
ALTER ROLE cos_console PASSWORD :'console';
SQL
