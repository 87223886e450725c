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
--   session graph, all rows (its operators see everything), and writes only its own tables of sign-outs and
--   API keys (console_sign_outs, console_api_keys, which it creates when it starts and owns; no one else may
--   touch them). For an analyst it reads after `SET LOCAL ROLE <the analyst's role>`, so cos_analyst's
--   policies below decide; it may take only the roles it is a member of:   GRANT alice TO cos_console;
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

-- Each table of a projection belongs to the service that writes it, whoever created it (an operator's `cos up`
-- or replay); nobody else holds a privilege on it (a grant made by hand is taken back) but the roles its
-- declaration names as readers, each with its row-level security policy. Tables that exist only where their
-- projection runs (the session graph, the Memory plugin) are skipped where they do not exist.
-- The section is generated from the table declarations; a test keeps it equal to them
-- (tests/deploy/test_roles_generated.py prints the right content when it differs).
-- BEGIN generated from the table declarations (commonos.runtime.tables.roles_sql)
DO $$
DECLARE part regclass;
BEGIN
    IF to_regnamespace('graph') IS NOT NULL THEN
        ALTER SCHEMA graph OWNER TO cos_journal_writer;
        REVOKE ALL ON SCHEMA graph FROM PUBLIC;
        GRANT USAGE ON SCHEMA graph TO cos_analyst;
        GRANT USAGE ON SCHEMA graph TO cos_console;
    END IF;
    IF to_regclass('public.profiles') IS NOT NULL THEN
        ALTER TABLE profiles OWNER TO cos_journal_writer;
        REVOKE ALL ON profiles FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON profiles TO cos_console;
        GRANT SELECT ON profiles TO cos_analyst;
        ALTER TABLE profiles ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON profiles;
        CREATE POLICY console_reads_all ON profiles FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON profiles;
        CREATE POLICY analyst_by_profile ON profiles FOR SELECT TO cos_analyst USING (id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.sessions') IS NOT NULL THEN
        ALTER TABLE sessions OWNER TO cos_journal_writer;
        REVOKE ALL ON sessions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON sessions TO cos_console;
        GRANT SELECT ON sessions TO cos_analyst;
        ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON sessions;
        CREATE POLICY console_reads_all ON sessions FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON sessions;
        CREATE POLICY analyst_by_profile ON sessions FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.turns') IS NOT NULL THEN
        ALTER TABLE turns OWNER TO cos_journal_writer;
        REVOKE ALL ON turns FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'turns'::regclass LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO cos_journal_writer', part);
        END LOOP;
        GRANT SELECT ON turns TO cos_console;
        GRANT SELECT ON turns TO cos_analyst;
        ALTER TABLE turns ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON turns;
        CREATE POLICY console_reads_all ON turns FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON turns;
        CREATE POLICY analyst_by_profile ON turns FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.messages') IS NOT NULL THEN
        ALTER TABLE messages OWNER TO cos_journal_writer;
        REVOKE ALL ON messages FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'messages'::regclass LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO cos_journal_writer', part);
        END LOOP;
        GRANT SELECT ON messages TO cos_console;
        GRANT SELECT ON messages TO cos_analyst;
        GRANT SELECT ON messages TO cos_loop;
        ALTER TABLE messages ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON messages;
        CREATE POLICY console_reads_all ON messages FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON messages;
        CREATE POLICY analyst_by_profile ON messages FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
        DROP POLICY IF EXISTS loop_reads_all ON messages;
        CREATE POLICY loop_reads_all ON messages FOR SELECT TO cos_loop USING (true);
    END IF;
    IF to_regclass('public.tool_calls') IS NOT NULL THEN
        ALTER TABLE tool_calls OWNER TO cos_journal_writer;
        REVOKE ALL ON tool_calls FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'tool_calls'::regclass LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO cos_journal_writer', part);
        END LOOP;
        GRANT SELECT ON tool_calls TO cos_console;
        GRANT SELECT ON tool_calls TO cos_analyst;
        ALTER TABLE tool_calls ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON tool_calls;
        CREATE POLICY console_reads_all ON tool_calls FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON tool_calls;
        CREATE POLICY analyst_by_profile ON tool_calls FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.approvals') IS NOT NULL THEN
        ALTER TABLE approvals OWNER TO cos_journal_writer;
        REVOKE ALL ON approvals FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'approvals'::regclass LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO cos_journal_writer', part);
        END LOOP;
        GRANT SELECT ON approvals TO cos_console;
        GRANT SELECT ON approvals TO cos_analyst;
        ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON approvals;
        CREATE POLICY console_reads_all ON approvals FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON approvals;
        CREATE POLICY analyst_by_profile ON approvals FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.projection_positions') IS NOT NULL THEN
        ALTER TABLE projection_positions OWNER TO cos_journal_writer;
        REVOKE ALL ON projection_positions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON projection_positions TO cos_console;
    END IF;
    IF to_regclass('public.profile_deletions') IS NOT NULL THEN
        ALTER TABLE profile_deletions OWNER TO cos_journal_writer;
        REVOKE ALL ON profile_deletions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.memory_entries') IS NOT NULL THEN
        ALTER TABLE memory_entries OWNER TO cos_journal_writer;
        REVOKE ALL ON memory_entries FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON memory_entries TO cos_analyst;
        ALTER TABLE memory_entries ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS analyst_by_profile ON memory_entries;
        CREATE POLICY analyst_by_profile ON memory_entries FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.memory_changes_applied') IS NOT NULL THEN
        ALTER TABLE memory_changes_applied OWNER TO cos_journal_writer;
        REVOKE ALL ON memory_changes_applied FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.memory_session_owners') IS NOT NULL THEN
        ALTER TABLE memory_session_owners OWNER TO cos_journal_writer;
        REVOKE ALL ON memory_session_owners FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.memory_profile_deletions') IS NOT NULL THEN
        ALTER TABLE memory_profile_deletions OWNER TO cos_journal_writer;
        REVOKE ALL ON memory_profile_deletions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.model_calls') IS NOT NULL THEN
        ALTER TABLE model_calls OWNER TO cos_billing;
        REVOKE ALL ON model_calls FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'model_calls'::regclass LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO cos_billing', part);
        END LOOP;
        GRANT SELECT ON model_calls TO cos_console;
        GRANT SELECT ON model_calls TO cos_analyst;
        ALTER TABLE model_calls ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON model_calls;
        CREATE POLICY console_reads_all ON model_calls FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON model_calls;
        CREATE POLICY analyst_by_profile ON model_calls FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.model_call_days') IS NOT NULL THEN
        ALTER TABLE model_call_days OWNER TO cos_billing;
        REVOKE ALL ON model_call_days FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON model_call_days TO cos_console;
        GRANT SELECT ON model_call_days TO cos_analyst;
        ALTER TABLE model_call_days ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON model_call_days;
        CREATE POLICY console_reads_all ON model_call_days FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON model_call_days;
        CREATE POLICY analyst_by_profile ON model_call_days FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.session_costs') IS NOT NULL THEN
        ALTER TABLE session_costs OWNER TO cos_billing;
        REVOKE ALL ON session_costs FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON session_costs TO cos_console;
        GRANT SELECT ON session_costs TO cos_analyst;
        ALTER TABLE session_costs ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON session_costs;
        CREATE POLICY console_reads_all ON session_costs FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON session_costs;
        CREATE POLICY analyst_by_profile ON session_costs FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('public.billing_positions') IS NOT NULL THEN
        ALTER TABLE billing_positions OWNER TO cos_billing;
        REVOKE ALL ON billing_positions FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON billing_positions TO cos_console;
    END IF;
    IF to_regclass('public.budget_spend') IS NOT NULL THEN
        ALTER TABLE budget_spend OWNER TO cos_billing;
        REVOKE ALL ON budget_spend FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON budget_spend TO cos_console;
    END IF;
    IF to_regclass('public.budget_alerts') IS NOT NULL THEN
        ALTER TABLE budget_alerts OWNER TO cos_billing;
        REVOKE ALL ON budget_alerts FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON budget_alerts TO cos_console;
    END IF;
    IF to_regclass('public.billing_reprices') IS NOT NULL THEN
        ALTER TABLE billing_reprices OWNER TO cos_billing;
        REVOKE ALL ON billing_reprices FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.billing_outbox') IS NOT NULL THEN
        ALTER TABLE billing_outbox OWNER TO cos_billing;
        REVOKE ALL ON billing_outbox FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.billing_session_owners') IS NOT NULL THEN
        ALTER TABLE billing_session_owners OWNER TO cos_billing;
        REVOKE ALL ON billing_session_owners FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('public.billing_profile_deletions') IS NOT NULL THEN
        ALTER TABLE billing_profile_deletions OWNER TO cos_billing;
        REVOKE ALL ON billing_profile_deletions FROM PUBLIC, cos_journal_writer, cos_loop, cos_console, cos_analyst;
    END IF;
    IF to_regclass('graph.sessions') IS NOT NULL THEN
        ALTER TABLE graph.sessions OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.sessions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.sessions TO cos_console;
        GRANT SELECT ON graph.sessions TO cos_analyst;
        ALTER TABLE graph.sessions ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.sessions;
        CREATE POLICY console_reads_all ON graph.sessions FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_profile ON graph.sessions;
        CREATE POLICY analyst_by_profile ON graph.sessions FOR SELECT TO cos_analyst USING (profile_id IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user));
    END IF;
    IF to_regclass('graph.session_attributes') IS NOT NULL THEN
        ALTER TABLE graph.session_attributes OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.session_attributes FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.session_attributes TO cos_console;
        GRANT SELECT ON graph.session_attributes TO cos_analyst;
        ALTER TABLE graph.session_attributes ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.session_attributes;
        CREATE POLICY console_reads_all ON graph.session_attributes FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.session_attributes;
        CREATE POLICY analyst_by_session ON graph.session_attributes FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.user_inputs') IS NOT NULL THEN
        ALTER TABLE graph.user_inputs OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.user_inputs FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.user_inputs TO cos_console;
        GRANT SELECT ON graph.user_inputs TO cos_analyst;
        ALTER TABLE graph.user_inputs ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.user_inputs;
        CREATE POLICY console_reads_all ON graph.user_inputs FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.user_inputs;
        CREATE POLICY analyst_by_session ON graph.user_inputs FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.model_invocations') IS NOT NULL THEN
        ALTER TABLE graph.model_invocations OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.model_invocations FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.model_invocations TO cos_console;
        GRANT SELECT ON graph.model_invocations TO cos_analyst;
        ALTER TABLE graph.model_invocations ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.model_invocations;
        CREATE POLICY console_reads_all ON graph.model_invocations FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.model_invocations;
        CREATE POLICY analyst_by_session ON graph.model_invocations FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.assistant_messages') IS NOT NULL THEN
        ALTER TABLE graph.assistant_messages OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.assistant_messages FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.assistant_messages TO cos_console;
        GRANT SELECT ON graph.assistant_messages TO cos_analyst;
        ALTER TABLE graph.assistant_messages ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.assistant_messages;
        CREATE POLICY console_reads_all ON graph.assistant_messages FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.assistant_messages;
        CREATE POLICY analyst_by_session ON graph.assistant_messages FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.tool_uses') IS NOT NULL THEN
        ALTER TABLE graph.tool_uses OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.tool_uses FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.tool_uses TO cos_console;
        GRANT SELECT ON graph.tool_uses TO cos_analyst;
        ALTER TABLE graph.tool_uses ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.tool_uses;
        CREATE POLICY console_reads_all ON graph.tool_uses FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.tool_uses;
        CREATE POLICY analyst_by_session ON graph.tool_uses FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.tool_results') IS NOT NULL THEN
        ALTER TABLE graph.tool_results OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.tool_results FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.tool_results TO cos_console;
        GRANT SELECT ON graph.tool_results TO cos_analyst;
        ALTER TABLE graph.tool_results ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.tool_results;
        CREATE POLICY console_reads_all ON graph.tool_results FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.tool_results;
        CREATE POLICY analyst_by_session ON graph.tool_results FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.file_touches') IS NOT NULL THEN
        ALTER TABLE graph.file_touches OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.file_touches FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.file_touches TO cos_console;
        GRANT SELECT ON graph.file_touches TO cos_analyst;
        ALTER TABLE graph.file_touches ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.file_touches;
        CREATE POLICY console_reads_all ON graph.file_touches FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.file_touches;
        CREATE POLICY analyst_by_session ON graph.file_touches FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.token_usage') IS NOT NULL THEN
        ALTER TABLE graph.token_usage OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.token_usage FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.token_usage TO cos_console;
        GRANT SELECT ON graph.token_usage TO cos_analyst;
        ALTER TABLE graph.token_usage ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.token_usage;
        CREATE POLICY console_reads_all ON graph.token_usage FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.token_usage;
        CREATE POLICY analyst_by_session ON graph.token_usage FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.vendor_ids') IS NOT NULL THEN
        ALTER TABLE graph.vendor_ids OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.vendor_ids FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.vendor_ids TO cos_console;
        GRANT SELECT ON graph.vendor_ids TO cos_analyst;
        ALTER TABLE graph.vendor_ids ENABLE ROW LEVEL SECURITY;
        DROP POLICY IF EXISTS console_reads_all ON graph.vendor_ids;
        CREATE POLICY console_reads_all ON graph.vendor_ids FOR SELECT TO cos_console USING (true);
        DROP POLICY IF EXISTS analyst_by_session ON graph.vendor_ids;
        CREATE POLICY analyst_by_session ON graph.vendor_ids FOR SELECT TO cos_analyst USING (session_id IN (SELECT id FROM graph.sessions));
    END IF;
    IF to_regclass('graph.positions') IS NOT NULL THEN
        ALTER TABLE graph.positions OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.positions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.positions TO cos_console;
    END IF;
    IF to_regclass('graph.profile_deletions') IS NOT NULL THEN
        ALTER TABLE graph.profile_deletions OWNER TO cos_journal_writer;
        REVOKE ALL ON graph.profile_deletions FROM PUBLIC, cos_billing, cos_loop, cos_console, cos_analyst;
        GRANT SELECT ON graph.profile_deletions TO cos_console;
    END IF;
END
$$;
-- END generated


-- The console's sign-outs and API keys (a console that has started once made the tables): its own, no one
-- else's (the keys' table as commonos.console.keys.API_KEYS declares it).
DO $$
BEGIN
    IF to_regclass('public.console_sign_outs') IS NOT NULL THEN
        ALTER TABLE console_sign_outs OWNER TO cos_console;
        REVOKE ALL ON console_sign_outs FROM PUBLIC, cos_journal_writer, cos_billing, cos_loop, cos_analyst;
    END IF;
    IF to_regclass('public.console_api_keys') IS NOT NULL THEN
        ALTER TABLE console_api_keys OWNER TO cos_console;
        REVOKE ALL ON console_api_keys FROM PUBLIC, cos_journal_writer, cos_billing, cos_loop, cos_analyst;
    END IF;
END
$$;

COMMIT;
