// The unmodified E2B JS SDK against `guilds serve --e2b`: E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY come from the environment, E2B_OTHER_KEY is a second key of the same server.
// Each step prints one line "ok <name>"; the first failure prints "FAILED <name>: ..." and exits 1.
import assert from 'node:assert/strict'
import { CommandExitError, NotFoundError, Sandbox, SandboxError, TimeoutError, AuthenticationError } from 'e2b'

const marker = process.env.E2B_TEST_MARKER
let sbx

async function step(name, body) {
  try {
    await body()
    console.log(`ok ${name}`)
  } catch (err) {
    console.log(`FAILED ${name}: ${err && err.stack ? err.stack : err}`)
    if (sbx) await sbx.kill().catch(() => {})
    process.exit(1)
  }
}

async function rejects(promise, kind) {
  try {
    await promise
  } catch (err) {
    assert.ok(err instanceof kind, `expected ${kind.name}, got ${err && err.constructor.name}: ${err}`)
    return err
  }
  assert.fail(`expected ${kind.name}, got no error`)
}

await step('create', async () => {
  sbx = await Sandbox.create({ envs: { GREETING: 'hello from js' }, metadata: { suite: 'js' }, timeoutMs: 120_000 })
  assert.ok(sbx.sandboxId)
})

await step('run with streamed stdout and stderr', async () => {
  const seen = []
  const result = await sbx.commands.run('echo out; echo err >&2; echo $GREETING', { onStdout: (d) => seen.push(d) })
  assert.equal(result.exitCode, 0)
  assert.equal(result.stdout, 'out\nhello from js\n')
  assert.equal(result.stderr, 'err\n')
  assert.equal(seen.join(''), result.stdout)
})

await step('exit code', async () => {
  const err = await rejects(sbx.commands.run('echo before; exit 3'), CommandExitError)
  assert.equal(err.exitCode, 3)
  assert.equal(err.stdout, 'before\n')
})

await step('background, then reconnect by pid from a new client', async () => {
  const handle = await sbx.commands.run('sleep 1.5; echo finished', { background: true })
  await handle.disconnect()
  const again = await Sandbox.connect(sbx.sandboxId)
  const listed = await again.commands.list()
  assert.ok(listed.some((p) => p.pid === handle.pid))
  const result = await (await again.commands.connect(handle.pid)).wait()
  assert.equal(result.stdout, 'finished\n')
})

await step('kill', async () => {
  const handle = await sbx.commands.run(`bash -c 'sleep 300; echo ${marker}'`, { background: true })
  assert.equal(await sbx.commands.kill(handle.pid), true)
  const err = await rejects(handle.wait(), CommandExitError)
  assert.equal(err.exitCode, -1)
  const listed = await sbx.commands.list()
  assert.ok(!listed.some((p) => p.pid === handle.pid))
})

await step('stdin', async () => {
  const handle = await sbx.commands.run("cat; echo '<eof>'", { background: true, stdin: true })
  await sbx.commands.sendStdin(handle.pid, 'line one\n')
  await sbx.commands.closeStdin(handle.pid)
  assert.equal((await handle.wait()).stdout, 'line one\n<eof>\n')
})

await step('timeout stops the command', async () => {
  await rejects(sbx.commands.run(`bash -c 'sleep 300; echo ${marker}-t'`, { timeoutMs: 2000 }), TimeoutError)
})

await step('files', async () => {
  const info = await sbx.files.write('js/a.txt', 'alpha\n')
  assert.equal(info.name, 'a.txt')
  assert.equal(await sbx.files.read('js/a.txt'), 'alpha\n')
  assert.deepEqual((await sbx.files.list('js')).map((e) => e.name), ['a.txt'])
  assert.equal((await sbx.files.getInfo('js/a.txt')).size, 6)
  assert.equal(await sbx.files.makeDir('js/sub'), true)
  await sbx.files.rename('js/a.txt', 'js/sub/b.txt')
  assert.equal(await sbx.files.exists('js/sub/b.txt'), true)
  await sbx.files.remove('js')
  assert.equal(await sbx.files.exists('js'), false)
  await rejects(sbx.files.read('js/sub/b.txt'), NotFoundError)
})

await step('paths outside the home', async () => {
  for (const path of ['/etc/passwd', '../outside.txt']) {
    let refused = null
    try {
      await sbx.files.read(path)
    } catch (err) {
      refused = err
    }
    assert.ok(refused && /outside the home/.test(String(refused)), String(refused))
  }
})

await step('keys', async () => {
  const mine = await Sandbox.list().nextItems()
  assert.ok(mine.some((s) => s.sandboxId === sbx.sandboxId))
  const theirs = await Sandbox.list({ apiKey: process.env.E2B_OTHER_KEY }).nextItems()
  assert.ok(!theirs.some((s) => s.sandboxId === sbx.sandboxId))
  await rejects(Sandbox.connect(sbx.sandboxId, { apiKey: process.env.E2B_OTHER_KEY }), NotFoundError)
  await rejects(Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(40) }), AuthenticationError)
})

await step('network options', async () => {
  // the agent's network is off: a host is more than it allows, and the client may not widen it
  const err = await rejects(Sandbox.create({ network: { allowOut: ['elsewhere.example.org'], denyOut: ['0.0.0.0/0'] } }),
    SandboxError)
  assert.equal(err.statusCode, 400)
  assert.match(err.message, /network\.allowOut: 'elsewhere\.example\.org' is not in the agent's network/)
  // a range denied of a network that is off already: nothing to deny, served as the agent's
  const partial = await Sandbox.create({ network: { denyOut: ['10.0.0.0/8'] }, timeoutMs: 60_000 })
  assert.equal((await partial.commands.run('echo denied-nothing')).stdout, 'denied-nothing\n')
  await partial.kill()
  const open = await Sandbox.create({ allowInternetAccess: true, timeoutMs: 60_000 })
  assert.equal((await open.commands.run('echo served')).stdout, 'served\n')
  await open.kill()
})

await step('snapshots and fork', async () => {
  await sbx.files.write('snap.txt', 'before')
  const snapshot = await sbx.createSnapshot({ name: 'js-snap' })
  assert.equal(snapshot.snapshotId, 'default/js-snap:default')
  assert.deepEqual(snapshot.names, ['default/js-snap:default'])
  await sbx.files.write('snap.txt', 'after')
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), [snapshot.snapshotId])
  const made = await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60_000 })
  assert.equal(await made.files.read('snap.txt'), 'before')
  await made.kill()
  const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
  assert.equal(forks.length, 2)
  for (const child of forks) {
    assert.ok(child instanceof Sandbox, String(child))
    assert.equal(await child.files.read('snap.txt'), 'after')
    await child.files.write('snap.txt', child.sandboxId)
  }
  assert.equal(await sbx.files.read('snap.txt'), 'after')
  for (const child of forks) {
    assert.equal(await child.files.read('snap.txt'), child.sandboxId)
    await child.kill()
  }
  assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), false)
  const gone = await rejects(Sandbox.create(snapshot.snapshotId), SandboxError)
  assert.match(gone.message, /^404: template 'default\/js-snap:default' not found/)
})

await step('kill the sandbox', async () => {
  const id = sbx.sandboxId
  await sbx.kill()
  sbx = undefined
  await rejects(Sandbox.connect(id), NotFoundError)
  console.log(`sandbox ${id}`)
})
