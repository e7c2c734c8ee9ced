// The unmodified E2B JS SDK's Template against guilds serve --e2b (tests/test_e2b_templates.py):
// a build from the base image with a COPY of uploaded files, ENV and RUN, a sandbox made of it,
// exists, a failing step's error. Prints "ok <step>" for each; E2B_TEST_CONTEXT is the folder
// the COPY's files are in, E2B_TEST_NAME the template's name.
import { Sandbox, Template } from 'e2b'

const name = process.env.E2B_TEST_NAME
const ok = (step) => console.log(`ok ${step}`)
const check = (cond, what) => { if (!cond) throw new Error(what) }

const logs = []
const template = Template({ fileContextPath: process.env.E2B_TEST_CONTEXT })
  .fromBaseImage()
  .copy('folder/*', 'folder')
  .setEnvs({ GREETING: 'hello from js' })
  .runCmd('cat folder/test.txt && echo "$GREETING" > made.txt')
const info = await Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) })
check(info.templateId && logs.some((line) => line.includes('This is a test file.')), `logs: ${logs.join(' | ')}`)
ok('build')

const box = await Sandbox.create(name, { timeoutMs: 60_000 })
try {
  const found = await box.commands.run('cat made.txt folder/test.txt; echo; echo "$GREETING"')
  check(found.stdout === 'hello from js\nThis is a test file.\nhello from js\n', `stdout: ${JSON.stringify(found.stdout)}`)
} finally {
  await box.kill()
}
ok('sandbox of the template')

check(await Template.exists(name) && !(await Template.exists(`${name}-none`)), 'exists')
ok('exists')

let failed = null
try {
  await Template.build(Template().fromBaseImage().runCmd('echo out && false'), `${name}-failing`)
} catch (error) {
  failed = error
}
check(failed && /failed to run command 'echo out && false': exit status 1/.test(failed.message), `error: ${failed}`)
ok('a failing step')
