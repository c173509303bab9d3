#pragma once

#include <memory>

namespace dlslime {

// fork(): a child inherits the library's objects (endpoints, runtimes, verbs and GPU
// objects) but none of its threads, and its kernel objects (sockets in epoll sets, verbs
// contexts) are shared with the parent. An object therefore belongs to the process that
// made it: it records the generation at construction, and in a process of another
// generation (a fork() child: every child bumps it, through pthread_atfork) it must be
// neither used nor torn down (docs/api.md: "An endpoint created before fork() cannot be
// used in the child"). One counter for the whole library.
unsigned long fork_generation() noexcept;

// Holds an object inherited from the parent for the rest of this (child) process: it is
// never destroyed here, since its destructor would join threads that do not exist and
// release kernel objects the parent still uses.
void keep_inherited(std::shared_ptr<const void> object);

}  // namespace dlslime
