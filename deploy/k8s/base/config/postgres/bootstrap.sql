-- CommonOS database roles, part 1 of 2: the roles themselves, before any service starts. Idempotent.
--
-- Run as a superuser (or a role with CREATEROLE) in the CommonOS database, e.g.
--   psql -v ON_ERROR_STOP=1 -d commonos -f bootstrap.sql
-- then give the login roles their passwords (initdb/10-commonos-roles.sh does both from the environment).
-- Once the services have created their tables, apply roles.sql (part 2): it grants the table privileges,
-- hands each table to the service that writes it, and sets up row-level security for analysts.
--
--   cos_journal_writer  the journal-writer: creates and owns the core tables (and the graph schema)
--   cos_billing         billing: creates and owns model_calls and its own tables; no core table
--   cos_loop            the loop: reads messages (session_search), writes nothing
--   cos_console         the web console: reads every projection (core tables, model_calls, budgets, positions,
--                       graph.*); writes only its own tables of sign-outs and API keys (console_sign_outs,
--                       console_api_keys, which it creates);
--                       reads for an analyst after SET ROLE to that analyst's role, so it must be a member of
--                       each: GRANT <analyst> TO cos_console
--   cos_analyst         group role (no login) of read-only analysts; each analyst is a login role IN ROLE
--                       cos_analyst and sees only the profiles granted to it in analyst_grants

DO $$
DECLARE
    wanted text[] := ARRAY['cos_journal_writer', 'cos_billing', 'cos_loop', 'cos_console'];
    r text;
BEGIN
    FOREACH r IN ARRAY wanted LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', r);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cos_analyst') THEN
        CREATE ROLE cos_analyst NOLOGIN;
    END IF;
    -- The writers apply their schemas on every start (`CREATE … IF NOT EXISTS`): they need CREATE on the
    -- schema, and the journal-writer on the database for its `graph` schema.
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO cos_journal_writer, cos_billing, cos_loop, cos_console, cos_analyst',
                   current_database());
    EXECUTE format('GRANT CREATE ON DATABASE %I TO cos_journal_writer', current_database());
END
$$;

-- Before PostgreSQL 15 every role could create tables in public; only the writers (and the console, for its
-- table of sign-outs) may.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO cos_journal_writer, cos_billing, cos_loop, cos_console, cos_analyst;
GRANT CREATE ON SCHEMA public TO cos_journal_writer, cos_billing, cos_console;
