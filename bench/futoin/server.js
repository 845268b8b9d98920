'use strict';
// FutoIn's own FTN18 server for the streams benchmark (bench/streams/): futoin-eventstream's
// DBGenService and DBPushService (which serves poll 1.0 too) on a NodeExecutor (HTTP +
// WebSocket) with legacy basic auth, events in PostgreSQL through futoin-database's AutoConfig.
// Usage (from tests/interop/futoin, where the packages are installed):
//   DB_EVT_TYPE=postgresql DB_EVT_HOST=127.0.0.1 DB_EVT_PORT=5432 DB_EVT_USER=root \
//   DB_EVT_DB=<db> DB_EVT_MAXCONN=1 node bench/futoin/server.js '<json options>'
// Options: port, path (default /), users ({name: password}), evt (eventstream options,
// e.g. sleep_min). The tables must exist (futoin-eventstream/sql/active/postgresql).
// Prints {"ready": true, "port": N} once listening, {"error": ...} on unexpected errors.

const path = require( 'path' );
const modules = process.env.FUTOIN_MODULES ||
    path.join( __dirname, '..', '..', 'tests', 'interop', 'futoin', 'node_modules' );
const need = ( name ) => require( path.join( modules, name ) );

const $as = need( 'futoin-asyncsteps' );
const { AdvancedCCM } = need( 'futoin-invoker' );
const { NodeExecutor } = need( 'futoin-executor' );
const LegacySecurityProvider = need( 'futoin-executor/LegacySecurityProvider' );
const DBServiceApp = need( 'futoin-eventstream/DBServiceApp' );

const opts = JSON.parse( process.argv[2] || '{}' );
const out = ( obj ) => process.stdout.write( JSON.stringify( obj ) + '\n' );
const notExpected = ( ...args ) => out( { error: 'notExpected', info: args.map( String ) } );

function start()
{
    const ccm = new AdvancedCCM();
    $as().add(
        ( as ) =>
        {
            const secprov = new LegacySecurityProvider( as, ccm );
            for ( const [ user, password ] of Object.entries( opts.users || {} ) )
            {
                secprov.addUser( user, password );
            }
            const executor = new NodeExecutor( ccm, {
                httpAddr: '127.0.0.1',
                httpPort: opts.port,
                httpPath: opts.path || '/',
                secureChannel: true,
                securityProvider: secprov,
                // true freezes Object.prototype, which moment (futoin-database) then fails on
                secureObjectPrototype: false,
            } );
            executor.on( 'notExpected', notExpected );
            executor.once( 'ready', () => out( { ready: true, port: opts.port } ) );
            new DBServiceApp( as, {
                ccm,
                executor,
                notExpectedHandler: notExpected,
                databaseConfig: process.env,
                evtOptions: opts.evt || {},
            } );
        },
        ( as, err ) =>
        {
            out( { error: err, info: as.state.error_info || null } );
            process.exit( 3 );
        }
    ).execute();
}

process.on( 'SIGTERM', () => process.exit( 0 ) );
start();
