"""The compiled parts, all optional: without a C compiler (or Cython) the install goes on
and the pure-Python modules run.

- the audit trail's hot hooks (``broker/audit/_hooks.c``; ``broker.audit.hooks`` has the
  Python version of the same class);
- the AMQP codec's hot modules, compiled by Cython from their own ``.py`` sources
  (``broker/amqp/builds.py`` lists them and chooses the build at import; the ``.py`` files
  stay the reference).
"""
from setuptools import Extension, setup

ext_modules = [Extension("broker.audit._hooks", ["broker/audit/_hooks.c"],
                         optional=True, extra_compile_args=["-O2"])]

# the list in broker/amqp/builds.py, read without importing the package
_AMQP_COMPILED = ("fields", "spec", "codec", "output", "connection")

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: the pure modules run
    pass
else:
    amqp = [Extension(f"broker.amqp.{m}", [f"broker/amqp/{m}.py"], optional=True,
                      extra_compile_args=["-O2"]) for m in _AMQP_COMPILED]
    ext_modules += cythonize(amqp, language_level=3, quiet=True,
                             compiler_directives={"binding": True})

setup(ext_modules=ext_modules)
