// trainer/cmd_init.c — placeholder until init lands.
#include "trainer/commands.h"
int cmd_init(int argc, char **argv) { (void)argc, (void)argv; return cmd_not_built("init", "issue 2"); }
