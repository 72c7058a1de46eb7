
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'lockrun' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'lockrun'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'lockrun' {
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key namespace on the server')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'Run this string with /bin/sh -c')
            [CompletionResult]::new('--command', '--command', [CompletionResultType]::ParameterName, 'Run this string with /bin/sh -c')
            [CompletionResult]::new('-t', '-t', [CompletionResultType]::ParameterName, 'Lease length, e.g. 500ms, 30s, 2m, "1h 30m"')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease length, e.g. 500ms, 30s, 2m, "1h 30m"')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock''s -w takes it')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Up to N holders at once (a counting semaphore); each job gets its place 0..N-1 in LOCKRUN_SLOT. Every user of the name must agree on N')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips quietly, as with flock -n -E 0 in a crontab)')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips quietly, as with flock -n -E 0 in a crontab)')
            [CompletionResult]::new('--label', '--label', [CompletionResultType]::ParameterName, 'A note shown by `status` and in waiting messages beside host:pid (a pipeline id, a ticket)')
            [CompletionResult]::new('--metrics-file', '--metrics-file', [CompletionResultType]::ParameterName, 'At the end of every run (skipped, ran, lost, failed) replace PATH, atomically, with Prometheus text for node_exporter''s textfile collector: end time, acquired, wait and hold seconds, exit code, lease lost, token. A PATH that cannot be written costs one warning, never the job or its exit code')
            [CompletionResult]::new('--kill-after', '--kill-after', [CompletionResultType]::ParameterName, 'Grace between SIGTERM and SIGKILL when the job must stop (default: ttl/10)')
            [CompletionResult]::new('--min-hold', '--min-hold', [CompletionResultType]::ParameterName, 'Keep the lock held at least DUR after it was granted, also once the job ended, counted on the engine''s clock: a crontab line on several hosts then runs once per window. A longer job releases at its end')
            [CompletionResult]::new('--max-waiters', '--max-waiters', [CompletionResultType]::ParameterName, 'Wait only while fewer than N requests of this name wait; otherwise give up at once with the conflict code (-E). --max-waiters 1 coalesces: the running job plus one queued run')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)')
            [CompletionResult]::new('--nonblock', '--nonblock', [CompletionResultType]::ParameterName, 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)')
            [CompletionResult]::new('--nb', '--nb', [CompletionResultType]::ParameterName, 'Give up at once if the lock is held (flock''s --nonblock and --nb work too)')
            [CompletionResult]::new('-x', '-x', [CompletionResultType]::ParameterName, 'An exclusive lock, the default (as flock''s -x and -e)')
            [CompletionResult]::new('--exclusive', '--exclusive', [CompletionResultType]::ParameterName, 'An exclusive lock, the default (as flock''s -x and -e)')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'A shared (reader) lock, as flock''s -s: shared holders run together, never beside an exclusive one')
            [CompletionResult]::new('--shared', '--shared', [CompletionResultType]::ParameterName, 'A shared (reader) lock, as flock''s -s: shared holders run together, never beside an exclusive one')
            [CompletionResult]::new('--supersede', '--supersede', [CompletionResultType]::ParameterName, 'Replace the waiting requests of this name that asked for --supersede too (newest wins); each replaced one gives up with the conflict code. Holders and other waiters are never touched')
            [CompletionResult]::new('--preempt', '--preempt', [CompletionResultType]::ParameterName, 'Ask the holders of this name to stop: each stops its job at its next renewal (TERM, grace, KILL) and exits 76; then wait our turn, so the job starts only once every process of theirs is gone')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show whether NAME is held; without NAME (or as `list`), every name')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'Show whether NAME is held; without NAME (or as `list`), every name')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Break a lock (operators)')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check an engine before the first incident, read-only')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockrun;status' {
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key namespace on the server')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object (without NAME: an array of them) instead of text')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'lockrun;list' {
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key namespace on the server')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object (without NAME: an array of them) instead of text')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'lockrun;release' {
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Break only the holder with token T (default: every holder)')
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key namespace on the server')
            [CompletionResult]::new('--force', '--force', [CompletionResultType]::ParameterName, 'Required: breaking a lock someone holds is deliberate')
            [CompletionResult]::new('--now', '--now', [CompletionResultType]::ParameterName, 'Delete the lease at once and wake a waiter. Unsafe without fencing: the old job may still be running when the next one starts')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'lockrun;doctor' {
            [CompletionResult]::new('-u', '-u', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--url', '--url', [CompletionResultType]::ParameterName, 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key namespace on the server')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress on stderr (-vv also shows every renewal)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print only errors')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'lockrun;help' {
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show whether NAME is held; without NAME (or as `list`), every name')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'Show whether NAME is held; without NAME (or as `list`), every name')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Break a lock (operators)')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check an engine before the first incident, read-only')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockrun;help;status' {
            break
        }
        'lockrun;help;list' {
            break
        }
        'lockrun;help;release' {
            break
        }
        'lockrun;help;doctor' {
            break
        }
        'lockrun;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
