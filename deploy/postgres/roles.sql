-- CommonOS database roles, part 2 of 2: table privileges and row-level security. Idempotent.
--
-- Apply as a superuser in the CommonOS database AFTER bootstrap.sql and after the journal-writer and billing
-- have started once (they create the tables this file refers to), and again after every upgrade that adds
-- tables:   psql -v ON_ERROR_STOP=1 -d commonos -f roles.sql
--
-- What it leaves:
-- * cos_journal_writer owns (and alone writes) the core tables, its position table, the graph schema and the
--   Memory plugin's tables it projects; it has no privilege on billing's tables.
-- * cos_billing owns (and alone writes) model_calls and billing's own tables; it has no privilege on any core
--   table, so it can neither read nor write messages.
-- * cos_loop may read messages (session_search), nothing else.
-- * cos_console (the web console) reads the core tables, model_calls, the budget and position tables and the
--   session graph, all rows (its operators see everything), and writes only its own table of sign-outs
--   (console_sign_outs, which it creates when it starts and owns; no one else may touch it). For an analyst it reads after
--   `SET LOCAL ROLE <the analyst's role>`, so cos_analyst's policies below decide; it may take only the roles
--   it is a member of:   GRANT alice TO cos_console;
-- * Members of cos_analyst read sessions, turns, messages, tool calls, approvals, profiles and model calls of
--   the profiles granted to them, and nothing else:
--     CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE cos_analyst;
--     INSERT INTO analyst_grants (role_name, profile_id) VALUES ('alice', 'acme');
-- Owners are exempt from row-level security (it is enabled, not forced), so the writers are unaffected.

SET lock_timeout = '10s';

BEGIN;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cos_analyst') THEN
        RAISE EXCEPTION 'the CommonOS roles do not exist: apply bootstrap.sql first';
    END IF;
    IF to_regclass('public.messages') IS NULL OR to_regclass('public.model_calls') IS NULL THEN
        RAISE EXCEPTION 'the CommonOS tables do not exist yet: start the journal-writer and billing once, then apply roles.sql';
    END IF;
END
$$;

-- Each table belongs to the service that writes it, whoever created it (an operator's `cos up` or replay).
ALTER TABLE profiles OWNER TO cos_journal_writer;
ALTER TABLE sessions OWNER TO cos_journal_writer;
ALTER TABLE turns OWNER TO cos_journal_writer;
ALTER TABLE messages OWNER TO cos_journal_writer;
ALTER TABLE tool_calls OWNER TO cos_journal_writer;
ALTER TABLE approvals OWNER TO cos_journal_writer;
ALTER TABLE projection_positions OWNER TO cos_journal_writer;

ALTER TABLE model_calls OWNER TO cos_billing;
ALTER TABLE billing_positions OWNER TO cos_billing;
ALTER TABLE budget_spend OWNER TO cos_billing;
ALTER TABLE budget_alerts OWNER TO cos_billing;
ALTER TABLE billing_reprices OWNER TO cos_billing;
ALTER TABLE billing_session_owners OWNER TO cos_billing;
ALTER TABLE billing_profile_deletions OWNER TO cos_billing;

-- Tables that exist only where their projection runs: the session graph and the Memory plugin.
DO $$
DECLARE
    t text;
BEGIN
    IF to_regnamespace('graph') IS NOT NULL THEN
        ALTER SCHEMA graph OWNER TO cos_journal_writer;
        FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'graph' LOOP
            EXECUTE format('ALTER TABLE graph.%I OWNER TO cos_journal_writer', t);
        END LOOP;
        REVOKE ALL ON SCHEMA graph FROM PUBLIC;
    END IF;
    FOREACH t IN ARRAY ARRAY['memory_entries', 'memory_changes_applied', 'memory_session_owners',
                             'memory_profile_deletions', 'profile_deletions'] LOOP
        IF to_regclass('public.' || t) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I OWNER TO cos_journal_writer', t);
            EXECUTE format('REVOKE ALL ON %I FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst', t);
        END IF;
    END LOOP;
END
$$;

-- Nobody else holds a privilege on them (a grant made by hand is taken back).
REVOKE ALL ON profiles, sessions, turns, messages, tool_calls, approvals, projection_positions
    FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
REVOKE ALL ON model_calls, billing_positions, budget_spend, budget_alerts, billing_reprices, billing_session_owners,
    billing_profile_deletions
    FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;

-- The loop searches every profile's messages.
GRANT SELECT ON messages TO cos_loop;

-- Which analyst sees which profile. Analysts read only their own rows of it.
CREATE TABLE IF NOT EXISTS analyst_grants (
    role_name  text NOT NULL,
    profile_id text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role_name, profile_id)
);
REVOKE ALL ON analyst_grants FROM PUBLIC, cos_journal_writer, cos_billing, cos_loop, cos_console;
GRANT SELECT ON analyst_grants TO cos_analyst;
ALTER TABLE analyst_grants ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_own_grants ON analyst_grants;
CREATE POLICY analyst_own_grants ON analyst_grants FOR SELECT TO cos_analyst
    USING (role_name = current_user);

GRANT SELECT ON profiles, sessions, turns, messages, tool_calls, approvals, model_calls TO cos_analyst;

ALTER TABLE profiles ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON profiles;
CREATE POLICY analyst_by_profile ON profiles FOR SELECT TO cos_analyst
    USING (id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON sessions;
CREATE POLICY analyst_by_profile ON sessions FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

ALTER TABLE turns ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON turns;
CREATE POLICY analyst_by_profile ON turns FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

ALTER TABLE messages ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON messages;
CREATE POLICY analyst_by_profile ON messages FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
DROP POLICY IF EXISTS loop_reads_all ON messages;
CREATE POLICY loop_reads_all ON messages FOR SELECT TO cos_loop USING (true);

ALTER TABLE tool_calls ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON tool_calls;
CREATE POLICY analyst_by_profile ON tool_calls FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON approvals;
CREATE POLICY analyst_by_profile ON approvals FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

ALTER TABLE model_calls ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS analyst_by_profile ON model_calls;
CREATE POLICY analyst_by_profile ON model_calls FOR SELECT TO cos_analyst
    USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));

-- The console reads what its pages show, every row (row-level security is enabled on the per-profile tables:
-- a policy of its own lets it see them all; an analyst's reads, after SET ROLE, get cos_analyst's policies).
GRANT SELECT ON profiles, sessions, turns, messages, tool_calls, approvals, projection_positions, model_calls,
    billing_positions, budget_spend, budget_alerts TO cos_console;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['profiles', 'sessions', 'turns', 'messages', 'tool_calls', 'approvals',
                             'model_calls'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS console_reads_all ON %I', t);
        EXECUTE format('CREATE POLICY console_reads_all ON %I FOR SELECT TO cos_console USING (true)', t);
    END LOOP;
END
$$;

-- The console's sign-outs (a console that has started once made the table): its own, no one else's.
DO $$
BEGIN
    IF to_regclass('public.console_sign_outs') IS NOT NULL THEN
        ALTER TABLE console_sign_outs OWNER TO cos_console;
        REVOKE ALL ON console_sign_outs FROM PUBLIC, cos_journal_writer, cos_billing, cos_loop, cos_analyst;
    END IF;
END
$$;

-- The Memory plugin's entries, where they are projected, are per profile too.
DO $$
BEGIN
    IF to_regclass('public.memory_entries') IS NOT NULL THEN
        GRANT SELECT ON memory_entries TO cos_analyst;
        ALTER TABLE memory_entries ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS analyst_by_profile ON memory_entries;
        CREATE POLICY analyst_by_profile ON memory_entries FOR SELECT TO cos_analyst
            USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
END
$$;

COMMIT;

-- The session graph of imported work is per profile too: graph.sessions carries the importing profile and
-- every other graph table a session, so an analyst sees the graphs of the profiles granted to it only.
DO $$
DECLARE
    t text;
BEGIN
    IF to_regclass('graph.sessions') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA graph TO cos_analyst;
        GRANT SELECT ON graph.sessions TO cos_analyst;
        ALTER TABLE graph.sessions ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS analyst_by_profile ON graph.sessions;
        CREATE POLICY analyst_by_profile ON graph.sessions FOR SELECT TO cos_analyst
            USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
        FOREACH t IN ARRAY ARRAY['session_attributes', 'user_inputs', 'model_invocations', 'assistant_messages',
                                 'tool_uses', 'tool_results', 'file_touches', 'token_usage', 'vendor_ids'] LOOP
            EXECUTE format('GRANT SELECT ON graph.%I TO cos_analyst', t);
            EXECUTE format('ALTER TABLE graph.%I ENABLE ROW LEVEL SECURITY', t);
            EXECUTE format('DROP POLICY IF EXISTS analyst_by_session ON graph.%I', t);
            -- graph.sessions is itself filtered for the analyst: a row is visible when its session is.
            EXECUTE format('CREATE POLICY analyst_by_session ON graph.%I FOR SELECT TO cos_analyst '
                           'USING (session_id IN (SELECT id FROM graph.sessions))', t);
        END LOOP;
        -- The console reads the whole graph (its Imported page, the projection's position).
        GRANT USAGE ON SCHEMA graph TO cos_console;
        FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'graph' LOOP
            EXECUTE format('GRANT SELECT ON graph.%I TO cos_console', t);
            IF (SELECT relrowsecurity FROM pg_class WHERE oid = format('graph.%I', t)::regclass) THEN
                EXECUTE format('DROP POLICY IF EXISTS console_reads_all ON graph.%I', t);
                EXECUTE format('CREATE POLICY console_reads_all ON graph.%I FOR SELECT TO cos_console USING (true)', t);
            END IF;
        END LOOP;
    END IF;
END
$$;
