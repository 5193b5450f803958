// trainer/commands.h — the sub-commands of `moetrain`. Each takes the arguments after its
// name and returns the process exit code (core/common.h).
#pragma once

int cmd_plan(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_not_built(const char *name, const char *issue);
