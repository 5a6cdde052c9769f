"""The audit database's schema, as numbered migrations applied in order by `relaunch db migrate`
(relaunch/connectors/db_setup.py): each is one transaction, never edited once released; a change
is a new entry at the end."""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        create table incidents (
            id          text primary key,
            cluster     text not null,
            job_id      text not null,
            attempt     integer not null,
            created_at  timestamptz not null default now()
        );
        create table audit_events (
            id           bigserial primary key,
            incident_id  text not null references incidents(id),
            kind         text not null,
            at           timestamptz not null,
            actor        text not null,
            stage        text,
            nodes        text[] not null default '{}',
            summary      text not null default '',
            data         jsonb not null default '{}'::jsonb,
            dedupe_key   text unique
        );
        create index audit_events_incident on audit_events (incident_id, id);
        create index audit_events_nodes on audit_events using gin (nodes);
        create index audit_events_kind_at on audit_events (kind, at);
        create index incidents_job on incidents (cluster, job_id);
        create function audit_events_append_only() returns trigger language plpgsql as $$
        begin
            raise exception 'the audit trail is append-only';
        end $$;
        create trigger audit_events_append_only before update or delete on audit_events
            for each row execute function audit_events_append_only();
        """,
    ),
    (
        2,
        # The console's read side: newest incidents, audit search by actor, open incidents (an
        # anti-join against the small set of terminal stage rows), incidents by category.
        """
        create index incidents_created_at on incidents (created_at desc);
        create index audit_events_actor on audit_events (actor, id);
        create index audit_events_terminal on audit_events (incident_id)
            where kind = 'stage'
            and stage in ('done', 'held', 'no_action', 'rejected', 'expired', 'failed');
        create index audit_events_verdict_category on audit_events
            ((data->>'category'), incident_id) where kind = 'verdict';
        """,
    ),
    (
        3,
        # Pushed-in signals are recorded under one placeholder incident per cluster (every audit
        # row belongs to an incident); lists of recoveries read this view and leave it out.
        """
        create view recoveries as select * from incidents where id not like 'intake-%';
        """,
    ),
    (
        4,
        # A cluster's audited mode changes (promotions, demotions) are recorded under one
        # placeholder incident, `rollout-<cluster>`: not a recovery either. Plans are what the
        # scorecard reads, by time.
        """
        create or replace view recoveries as select * from incidents
            where id not like 'intake-%' and id not like 'rollout-%';
        create index audit_events_plan_at on audit_events (at) where kind = 'plan';
        """,
    ),
    (
        5,
        # A cluster's pauses and unpauses (the kill switch) are recorded under one placeholder
        # incident, `control-<cluster>`: not a recovery either.
        """
        create or replace view recoveries as select * from incidents
            where id not like 'intake-%' and id not like 'rollout-%'
            and id not like 'control-%';
        """,
    ),
    (
        6,
        # Data for years (docs/retention.md): audit rows in monthly range partitions on `at`,
        # so that a purge drops whole months. A unique constraint on a partitioned table must
        # hold the partition key, so the primary key is (id, at) (ids still come from one
        # sequence) and the dedupe keys move to a table of their own, written in the same
        # statement as the row. Deleting is refused unless the purge (`relaunch audit purge`,
        # its own role) says so for its transaction; UPDATE and TRUNCATE are refused always.
        # Existing rows are copied over inside this migration.
        """
        alter table audit_events rename to audit_events_unpartitioned;
        alter index audit_events_incident rename to audit_events_unpartitioned_incident;
        alter index audit_events_nodes rename to audit_events_unpartitioned_nodes;
        alter index audit_events_kind_at rename to audit_events_unpartitioned_kind_at;
        alter index audit_events_actor rename to audit_events_unpartitioned_actor;
        alter index audit_events_terminal rename to audit_events_unpartitioned_terminal;
        alter index audit_events_verdict_category
            rename to audit_events_unpartitioned_verdict_category;
        alter index audit_events_plan_at rename to audit_events_unpartitioned_plan_at;
        alter sequence audit_events_id_seq owned by none;

        create table audit_events (
            id           bigint not null default nextval('audit_events_id_seq'),
            incident_id  text not null references incidents(id),
            kind         text not null,
            at           timestamptz not null,
            actor        text not null,
            stage        text,
            nodes        text[] not null default '{}',
            summary      text not null default '',
            data         jsonb not null default '{}'::jsonb,
            dedupe_key   text,
            primary key (id, at)
        ) partition by range (at);
        alter sequence audit_events_id_seq owned by audit_events.id;
        create table audit_events_default partition of audit_events default;

        create table audit_dedupe (
            dedupe_key   text primary key,
            incident_id  text not null,
            at           timestamptz not null
        );
        create index audit_dedupe_incident on audit_dedupe (incident_id);

        -- Who purged what (never purged itself).
        create table audit_purges (
            id          bigserial primary key,
            at          timestamptz not null default now(),
            by          text not null,
            role        text not null default current_user,
            cluster     text not null,
            before      timestamptz not null,
            phase       text not null check (phase in ('started', 'done')),
            incidents   bigint not null default 0,
            rows        bigint not null default 0,
            partitions  text[] not null default '{}',
            bundles     bigint not null default 0
        );

        create or replace function audit_events_append_only() returns trigger
        language plpgsql as $$
        begin
            if tg_op = 'DELETE' and current_setting('relaunch.purge', true) = 'on' then
                return old;
            end if;
            raise exception 'the audit trail is append-only';
        end $$;
        create function audit_no_truncate() returns trigger language plpgsql as $$
        begin
            raise exception 'the audit trail is append-only: TRUNCATE is refused';
        end $$;
        create function audit_purges_kept() returns trigger language plpgsql as $$
        begin
            raise exception 'the record of purges is append-only';
        end $$;

        -- One month's partition (UTC), made once; rows of that month that fell into the
        -- default partition meanwhile move into it. Runs as the owner (security definer):
        -- the purge role keeps them coming without owning the table.
        create function audit_create_partition(month date) returns boolean
        language plpgsql security definer set search_path from current as $$
        declare
            name text := 'audit_events_p' || to_char(month, 'YYYYMM');
            lo timestamptz := date_trunc('month', month)::timestamp at time zone 'UTC';
            hi timestamptz := (date_trunc('month', month) + interval '1 month')::timestamp
                at time zone 'UTC';
        begin
            if to_regclass(name) is not null then
                return false;
            end if;
            if exists (select 1 from audit_events_default where at >= lo and at < hi) then
                alter table audit_events detach partition audit_events_default;
                execute format('create table %I partition of audit_events'
                    ' for values from (%L) to (%L)', name, lo, hi);
                perform set_config('relaunch.purge', 'on', true);
                with moved as (delete from audit_events_default
                               where at >= lo and at < hi returning *)
                insert into audit_events select * from moved;
                perform set_config('relaunch.purge', '', true);
                alter table audit_events attach partition audit_events_default default;
            else
                execute format('create table %I partition of audit_events'
                    ' for values from (%L) to (%L)', name, lo, hi);
            end if;
            execute format('create trigger audit_no_truncate before truncate on %I'
                ' for each statement execute function audit_no_truncate()', name);
            return true;
        end $$;

        -- This month's partition and the next `months_ahead`: `relaunch db migrate`,
        -- `relaunch audit maintain` and every purge call it. How many it made.
        create function audit_ensure_partitions(months_ahead integer) returns integer
        language plpgsql security definer set search_path from current as $$
        declare
            m date;
            made integer := 0;
        begin
            if months_ahead < 0 or months_ahead > 120 then
                raise exception 'months_ahead must be within 0..120, not %', months_ahead;
            end if;
            for m in select generate_series(
                    date_trunc('month', now() at time zone 'UTC'),
                    date_trunc('month', now() at time zone 'UTC')
                        + make_interval(months => months_ahead),
                    interval '1 month')::date loop
                if audit_create_partition(m) then
                    made := made + 1;
                end if;
            end loop;
            return made;
        end $$;

        -- Drop a whole month when every row in it may go: the month ends at or before
        -- `before`, and each of its rows belongs to an incident of `for_cluster` that is
        -- either a placeholder (intake-, rollout-: its rows go one by one) or has no row at
        -- or after `before`. The rows dropped, or -1 when the month must stay.
        create function audit_drop_partition(part text, before timestamptz, for_cluster text)
        returns bigint
        language plpgsql security definer set search_path from current as $$
        declare
            hi timestamptz;
            blocked boolean;
            n bigint;
        begin
            if part !~ '^audit_events_p[0-9]{6}$' then
                raise exception 'not an audit partition: %', part;
            end if;
            if not exists (select 1 from pg_inherits where inhrelid = to_regclass(part)
                           and inhparent = 'audit_events'::regclass) then
                return -1;
            end if;
            hi := (to_date(substr(part, 15), 'YYYYMM') + interval '1 month')::timestamp
                at time zone 'UTC';
            if hi > before then
                return -1;
            end if;
            execute format(
                'select exists (select 1 from (select distinct incident_id from %I) p'
                ' join incidents i on i.id = p.incident_id where i.cluster <> $2'
                ' or (i.id not like ''intake-%%'' and i.id not like ''rollout-%%'''
                ' and exists (select 1 from audit_events e where e.incident_id = i.id'
                ' and e.at >= $1)))', part) into blocked using before, for_cluster;
            if blocked then
                return -1;
            end if;
            perform set_config('relaunch.purge', 'on', true);
            execute format('delete from audit_dedupe d using %I p'
                ' where d.dedupe_key = p.dedupe_key', part);
            execute format('select count(*) from %I', part) into n;
            execute format('alter table audit_events detach partition %I', part);
            execute format('drop table %I', part);
            perform set_config('relaunch.purge', '', true);
            return n;
        end $$;
        revoke execute on function audit_create_partition(date) from public;
        revoke execute on function audit_ensure_partitions(integer) from public;
        revoke execute on function audit_drop_partition(text, timestamptz, text) from public;

        -- The months of the rows there are (ten years back at most; older ones land in the
        -- default partition), then the rows themselves.
        select audit_create_partition(m::date) from generate_series(
            greatest(
                date_trunc('month', coalesce((select min(at) from audit_events_unpartitioned),
                    now()) at time zone 'UTC'),
                date_trunc('month', now() at time zone 'UTC') - interval '120 months'),
            date_trunc('month', now() at time zone 'UTC'),
            interval '1 month') m;
        select audit_ensure_partitions(3);
        insert into audit_events select * from audit_events_unpartitioned;
        insert into audit_dedupe (dedupe_key, incident_id, at)
            select dedupe_key, incident_id, at from audit_events_unpartitioned
            where dedupe_key is not null;
        drop table audit_events_unpartitioned;

        create index audit_events_incident on audit_events (incident_id, id);
        create index audit_events_nodes on audit_events using gin (nodes);
        create index audit_events_kind_at on audit_events (kind, at);
        create index audit_events_actor on audit_events (actor, id);
        create index audit_events_terminal on audit_events (incident_id)
            where kind = 'stage'
            and stage in ('done', 'held', 'no_action', 'rejected', 'expired', 'failed');
        create index audit_events_verdict_category on audit_events
            ((data->>'category'), incident_id) where kind = 'verdict';
        create index audit_events_plan_at on audit_events (at) where kind = 'plan';

        create trigger audit_events_append_only before update or delete on audit_events
            for each row execute function audit_events_append_only();
        create trigger audit_no_truncate before truncate on audit_events
            for each statement execute function audit_no_truncate();
        create trigger audit_no_truncate before truncate on audit_events_default
            for each statement execute function audit_no_truncate();
        create trigger audit_dedupe_append_only before update or delete on audit_dedupe
            for each row execute function audit_events_append_only();
        create trigger audit_no_truncate before truncate on audit_dedupe
            for each statement execute function audit_no_truncate();
        create trigger audit_purges_kept before update or delete on audit_purges
            for each row execute function audit_purges_kept();
        create trigger audit_no_truncate before truncate on audit_purges
            for each statement execute function audit_no_truncate();
        create trigger incidents_no_truncate before truncate on incidents
            for each statement execute function audit_no_truncate();
        create trigger incidents_kept before update or delete on incidents
            for each row execute function audit_events_append_only();
        """,
    ),
]
